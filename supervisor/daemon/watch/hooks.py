"""Operator hooks: `on_finish` and `on_gpu_hang` commands run with the job's JSON on stdin.

For notifications (chat, e-mail) without polling. A hook runs as the daemon's user, in
its own session, and its whole process group is killed when it outlives
`hooks.timeout_s`; a failing hook is logged and never affects the job.

`on_finish` fires once per job, when it reaches a terminal state: after its last attempt
(`Hooks.after_attempt`), or without any attempt when it is cancelled while queued or one
of its dependencies fails (`Hooks.on_change`). `on_gpu_hang` fires
after every attempt that ended as `gpu_hang`, retried or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from supervisor.core.commands import AttemptEnded, Changed
from supervisor.core.jobs import FailureReason, Job, JobState
from supervisor.daemon import views
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import HooksConfig

if TYPE_CHECKING:
    from supervisor.core.records import Attempt
    from supervisor.daemon.store.memory_book import MemoryBook

log = structlog.get_logger("gpusvd.hooks")
STDERR_KEPT = 4096  # bytes of a failing hook's stderr that go to the log


def due(
    cfg: HooksConfig, job: Job, attempt_reason: str | None
) -> list[tuple[str, tuple[str, ...]]]:
    """Which hooks an end calls for: (name, argv) pairs, in the order they run."""
    out = []
    if attempt_reason == FailureReason.GPU_HANG.value and cfg.on_gpu_hang:
        out.append(("on_gpu_hang", cfg.on_gpu_hang))
    if job.state.terminal and cfg.on_finish:
        out.append(("on_finish", cfg.on_finish))
    return out


class Hooks:
    def __init__(self, cfg: HooksConfig, book: MemoryBook, broker: Broker) -> None:
        self.cfg = cfg
        self.book = book
        send, self.due = anyio.create_memory_object_stream[AttemptEnded | Changed](float("inf"))

        def offer(ev: AttemptEnded | Changed) -> None:
            if self.cfg.on_finish or self.cfg.on_gpu_hang:  # read now: a reload may set them
                send.send_nowait(ev)

        broker.subscribe(AttemptEnded, offer)
        broker.subscribe(Changed, offer)

    def reconfigure(self, cfg: HooksConfig) -> None:
        """The hooks of a reloaded config: events from now on run these."""
        self.cfg = cfg

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            task_status.started()
            async for ev in self.due:
                if isinstance(ev, AttemptEnded):
                    self._start(tg, due(self.cfg, ev.job, ev.attempt.reason), ev.job, ev.attempt)
                elif (
                    ev.old is not None and ev.old.state is JobState.QUEUED and ev.new.state.terminal
                ):
                    # A job that ends while queued has no attempt to report its end.
                    self._start(tg, due(self.cfg, ev.new, None), ev.new, None)

    def _start(
        self,
        tg: anyio.abc.TaskGroup,
        hooks: list[tuple[str, tuple[str, ...]]],
        job: Job,
        attempt: Attempt | None,
    ) -> None:
        if not hooks:
            return
        payload: dict[str, Any] = dict(
            views.job_json(job, host_memory=self.book.projection(job.spec))
        )
        payload["attempt"] = attempt.to_json() if attempt is not None else None
        for name, argv in hooks:
            tg.start_soon(run_hook, name, argv, payload, self.cfg.timeout_s)


async def run_hook(
    name: str, argv: Sequence[str], payload: dict[str, Any], timeout_s: float
) -> int | None:
    """The hook's exit code, or None when it could not start or timed out."""
    if not argv:
        return None
    data = json.dumps(payload).encode() + b"\n"
    # Not GPUSV_JOB_ID: that marks a job's own processes, which an abort kills.
    env = {**os.environ, "GPUSV_HOOK": name, "GPUSV_HOOK_JOB_ID": str(payload.get("id", ""))}
    try:
        proc = await anyio.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        log.warning("hook could not start", hook=name, argv=list(argv), error=str(exc))
        return None
    code: int | None = None
    stderr = bytearray()
    try:
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, proc, data)
                await _collect(proc, stderr)
            code = await proc.wait()
    finally:
        if code is None:  # timed out, or the daemon is stopping: nothing of it may stay
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await proc.aclose()
    if code is None:
        log.warning("hook timed out and was killed", hook=name, timeout_s=timeout_s)
    elif code != 0:
        tail = stderr.decode(errors="replace").strip()
        log.warning("hook failed", hook=name, exit_code=code, stderr=tail)
    return code


async def _feed(proc: anyio.abc.Process, data: bytes) -> None:
    """A hook that ignores its stdin must not stall on it, nor make us fail."""
    assert proc.stdin is not None
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await proc.stdin.send(data)
    await proc.stdin.aclose()


async def _collect(proc: anyio.abc.Process, out: bytearray) -> None:
    """Read stderr to its end (a full pipe would block the hook), keeping the last bytes."""
    assert proc.stderr is not None
    async for chunk in proc.stderr:
        out += chunk
        del out[:-STDERR_KEPT]
