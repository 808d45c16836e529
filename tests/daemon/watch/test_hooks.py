"""Operator hooks, run for real: which ends call which hook, what a hook reads on its
stdin (the job object with the attempt) and in its environment, and that a hook that
outlives its timeout is killed with its whole process group."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor.core.commands import AttemptEnded, Changed
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.records import Attempt
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import HooksConfig
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.watch.hooks import Hooks, due, run_hook

PATIENCE_S = 30.0
SPEC = JobSpec(("python", "t.py"), "/w", {"SECRET": "hunter2"}, 1001, 1001, name="train",
               mem_mb=3000, mem_key="k")  # fmt: skip
T = "2026-01-02T03:00:00.000Z"
BOTH = HooksConfig(on_finish=("finish",), on_gpu_hang=("hang",))


@pytest.mark.parametrize(
    ("state", "reason", "names"),
    [
        (JobState.SUCCEEDED, None, ["on_finish"]),
        (JobState.FAILED, "exit_nonzero", ["on_finish"]),
        (JobState.CANCELLED, None, ["on_finish"]),
        (JobState.QUEUED, "gpu_hang", ["on_gpu_hang"]),  # retried after a hang
        (JobState.FAILED, "gpu_hang", ["on_gpu_hang", "on_finish"]),  # the last one
        (JobState.QUEUED, "exit_nonzero", []),  # a retry: not finished
        (JobState.RUNNING, None, []),
    ],
)
def test_which_hooks_an_end_calls_for(
    state: JobState, reason: str | None, names: list[str]
) -> None:
    assert [n for n, _ in due(BOTH, Job(1, SPEC, state), reason)] == names


def test_only_configured_hooks_are_due() -> None:
    finished = Job(1, SPEC, JobState.FAILED)
    assert due(HooksConfig(), finished, "gpu_hang") == []
    assert due(HooksConfig(on_finish=("f", "-x")), finished, "gpu_hang") == [
        ("on_finish", ("f", "-x"))
    ]


def recorder(tmp_path: Path, name: str) -> tuple[str, ...]:
    """A hook that saves its stdin and its GPUSV_ environment under tmp_path/name.*"""
    script = tmp_path / f"{name}.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'cat > "{tmp_path}/{name}.in.tmp"\n'
        f'env | grep ^GPUSV_ | sort > "{tmp_path}/{name}.env"\n'
        f'mv "{tmp_path}/{name}.in.tmp" "{tmp_path}/{name}.in"\n'
    )
    script.chmod(0o755)
    return (str(script),)


async def wait_for(path: Path) -> None:
    with anyio.fail_after(PATIENCE_S):
        while not path.exists():
            await anyio.sleep(0.02)


async def test_a_finished_job_s_hooks_read_its_json_and_attempt(
    store: Store, tmp_path: Path
) -> None:
    broker = Broker()
    cfg = HooksConfig(
        on_finish=recorder(tmp_path, "finish"), on_gpu_hang=recorder(tmp_path, "hang")
    )
    hooks = Hooks(cfg, MemoryBook(store, broker, 0.1), broker)
    job = Job(7, SPEC, JobState.FAILED, T, T, T, reason=FailureReason.GPU_HANG, gpus=(1,),
              attempts=1, gpu_hang_used=1)  # fmt: skip
    attempt = Attempt(7, 1, (1,), T, "k", pid=99, ended_at=T, reason="gpu_hang", signal=9)
    async with anyio.create_task_group() as tg:
        await tg.start(hooks.run)
        broker.publish(AttemptEnded(job, attempt, (1,)))
        await wait_for(tmp_path / "finish.in")
        await wait_for(tmp_path / "hang.in")
        tg.cancel_scope.cancel()
    for name, hook in (("finish", "on_finish"), ("hang", "on_gpu_hang")):
        payload: dict[str, Any] = json.loads((tmp_path / f"{name}.in").read_text())
        assert (payload["id"], payload["state"], payload["reason"], payload["name"]) == (
            7, "failed", "gpu_hang", "train",
        )  # fmt: skip
        assert payload["host_memory"] == {
            "projected_mb": 3000,
            "basis": "declared",
            "runs": 0,
            "peak_mb": None,
        }
        assert payload["attempt"] == attempt.to_json()
        assert "hunter2" not in json.dumps(payload)
        assert (tmp_path / f"{name}.env").read_text() == (
            f"GPUSV_HOOK={hook}\nGPUSV_HOOK_JOB_ID=7\n"
        )


async def test_a_job_that_ends_while_queued_calls_on_finish_without_an_attempt(
    store: Store, tmp_path: Path
) -> None:
    broker = Broker()
    hooks = Hooks(HooksConfig(), MemoryBook(store, broker, 0.1), broker)
    queued = Job(3, SPEC, JobState.QUEUED, T)
    async with anyio.create_task_group() as tg:
        await tg.start(hooks.run)
        broker.publish(Changed(queued, Job(3, SPEC, JobState.CANCELLED, T)))  # no hook yet
        hooks.reconfigure(HooksConfig(on_finish=recorder(tmp_path, "finish")))  # a reload
        running = Job(4, SPEC, JobState.RUNNING, T)
        broker.publish(Changed(running, Job(4, SPEC, JobState.CANCELLED, T)))  # its attempt's
        broker.publish(Changed(None, Job(6, SPEC, JobState.FAILED, T)))  # recovered as ended
        broker.publish(Changed(Job(5, SPEC, JobState.QUEUED, T), Job(5, SPEC, JobState.FAILED, T)))
        await wait_for(tmp_path / "finish.in")
        tg.cancel_scope.cancel()
    payload = json.loads((tmp_path / "finish.in").read_text())
    assert (payload["id"], payload["state"], payload["attempt"]) == (5, "failed", None)


async def test_a_hook_s_exit_code_is_returned(tmp_path: Path) -> None:
    assert await run_hook("on_finish", ("sh", "-c", "exit 3"), {"id": 1}, PATIENCE_S) == 3
    assert await run_hook("on_finish", ("true",), {"id": 1, "x": "y" * 500_000}, PATIENCE_S) == 0
    assert await run_hook("on_finish", (str(tmp_path / "missing"),), {}, PATIENCE_S) is None
    assert await run_hook("on_finish", (), {}, PATIENCE_S) is None


async def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f'sleep 300 & echo $! > "{pids}.tmp"; mv "{pids}.tmp" "{pids}"; wait'
    code = await run_hook("on_finish", ("sh", "-c", script), {"id": 1}, 2.0)
    assert code is None
    child = int(pids.read_text())
    deadline = time.monotonic() + PATIENCE_S
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the hook's child outlived it"
        await anyio.sleep(0.02)
