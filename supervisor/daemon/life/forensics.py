"""The report the deadman writes before it exits: where the wedged abort is stuck, and why.

Every section is gathered on its own guard, so a failing or missing source (no
`nvidia-smi`, a provider that raises, a vanished pid) costs one line, never the report.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

RunningJobs = Callable[[], list[dict[str, Any]]]
KernelLines = Callable[[], list[str]]

SMI_TIMEOUT_S = 10.0
_MAX_KERNEL_LINES = 50
_MAX_D_STATE = 50


@dataclass(frozen=True)
class WatchedAbort:
    """One abort in flight: what it is, on which thread, since when, and its deadline."""

    what: str
    thread_name: str
    started_at: float  # wall clock, for people
    started_mono: float  # monotonic, for the deadline
    deadline_s: float
    thread_ident: int | None = None
    native_id: int | None = None

    @property
    def deadline(self) -> float:
        return self.started_mono + self.deadline_s


def describe_abort(abort: WatchedAbort, now_mono: float) -> str:
    """The abort's facts as report lines (pure)."""
    started = datetime.fromtimestamp(abort.started_at, UTC).isoformat(timespec="seconds")
    tid = f" (tid {abort.native_id})" if abort.native_id is not None else ""
    return "\n".join(
        [
            f"what: {abort.what}",
            f"thread: {abort.thread_name}{tid}",
            f"started: {started} ({now_mono - abort.started_mono:.1f} s ago, monotonic)",
            f"deadline: {abort.deadline_s:g} s",
        ]
    )


def header(abort: WatchedAbort) -> str:
    return (
        f"gpusvd deadman: abort {abort.what!r} did not return within {abort.deadline_s:g} s; "
        "exiting 70 so that systemd restarts the daemon"
    )


def thread_stacks(highlight: Mapping[int, str] | None = None) -> str:
    """Every other Python thread's stack with its kernel state; `highlight` labels some.

    The calling thread is left out: it is the one writing the report.
    """
    marks = highlight or {}
    threads = {t.ident: t for t in threading.enumerate() if t.ident is not None}
    frames = sys._current_frames()
    me = threading.get_ident()
    # Highlighted threads first: they are what the reader came for.
    order = sorted(
        (i for i in frames if i != me), key=lambda i: (i not in marks, _name(threads, i))
    )
    blocks = []
    for ident in order:
        thread = threads.get(ident)
        native = thread.native_id if thread is not None else None
        kernel = _task_state(native) if native is not None else ""
        label = f"  <-- {marks[ident]}" if ident in marks else ""
        title = f"Thread {_name(threads, ident)!r} (tid {native}){kernel}{label}"
        stack = "".join(traceback.format_stack(frames[ident])).rstrip()
        blocks.append(f"{title}\n{stack}")
    return "\n\n".join(blocks)


def _name(threads: Mapping[int, threading.Thread], ident: int) -> str:
    thread = threads.get(ident)
    return thread.name if thread is not None else f"<unregistered {ident}>"


def fallback_report(abort: WatchedAbort, note: str) -> str:
    """What memory and our own /proc entries tell, for when the full report got stuck."""
    return "\n".join(
        [
            header(abort),
            "--- abort ---",
            describe_abort(abort, time.monotonic()),
            note,
            "--- threads ---",
            _guarded(lambda: thread_stacks(_abort_mark(abort))),
        ]
    )


def nvidia_smi_read(command: str = "nvidia-smi", timeout_s: float = SMI_TIMEOUT_S) -> str:
    """A live `nvidia-smi` read, bounded: a hung GPU can wedge nvidia-smi too."""
    path = shutil.which(command)
    if path is None:
        return f"{command} not found"
    proc = subprocess.Popen(
        [path],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        # A bounded wait only: a process stuck in the driver (D state) is not reaped until
        # the driver lets go, and the deadman must still exit.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        if proc.stdout is not None:
            proc.stdout.close()
        return f"{command} did not answer within {timeout_s:g} s (killed; stuck in the driver?)"
    text = out.decode(errors="replace").rstrip()
    if proc.returncode != 0:
        text += f"\n({command} exited {proc.returncode})"
    return text


def describe_pid(pid: int) -> str:
    """One process: name, state, wchan and, where readable, its kernel stack."""
    try:
        proc = psutil.Process(pid)
        name, status = proc.name(), proc.status()
    except psutil.Error as exc:
        return f"pid {pid}: {type(exc).__name__}"
    line = f"pid {pid} ({name}) status {status} wchan {_read_proc(f'/proc/{pid}/wchan')}"
    stack = _read_proc(f"/proc/{pid}/stack")
    if status == psutil.STATUS_DISK_SLEEP and stack:
        line += "\n" + _indent(stack, "    ")
    return line


def describe_jobs(jobs: Iterable[Mapping[str, Any]]) -> str:
    blocks = []
    for job in jobs:
        job_id = job.get("job_id", job.get("id"))
        pids = [int(p) for p in job.get("pids", [])]
        extra = {k: v for k, v in job.items() if k not in ("job_id", "id", "pids")}
        title = f"job {job_id}: pids {', '.join(map(str, pids)) or 'none'}"
        if extra:
            title += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        blocks.append("\n".join([title, *(_indent(describe_pid(p), "  ") for p in pids)]))
    return "\n".join(blocks) or "no running jobs"


def uninterruptible_processes(limit: int = _MAX_D_STATE) -> str:
    """Host processes in D state: what a wedged driver call leaves behind."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.info["status"] == psutil.STATUS_DISK_SLEEP:
            found.append(describe_pid(proc.info["pid"]))
            if len(found) >= limit:
                found.append(f"(stopped after {limit})")
                break
    return "\n".join(found) or "none"


class Forensics:
    """Builds the deadman's report; the daemon plugs in what only it knows."""

    def __init__(
        self,
        *,
        running_jobs: RunningJobs | None = None,
        recent_kernel_lines: KernelLines | None = None,
        nvidia_smi: str = "nvidia-smi",
        smi_timeout_s: float = SMI_TIMEOUT_S,
    ) -> None:
        self._running_jobs = running_jobs
        self._kernel_lines = recent_kernel_lines
        self._smi = nvidia_smi
        self._smi_timeout_s = smi_timeout_s

    def provide(
        self,
        *,
        running_jobs: RunningJobs | None = None,
        recent_kernel_lines: KernelLines | None = None,
    ) -> None:
        """Register providers once the parts that own the facts exist."""
        if running_jobs is not None:
            self._running_jobs = running_jobs
        if recent_kernel_lines is not None:
            self._kernel_lines = recent_kernel_lines

    def __call__(self, abort: WatchedAbort) -> str:
        # Cheap, in-memory sections first: if a later read blocks, the deadman's own
        # time limit cuts the report short, and these must already be in it.
        sections: list[tuple[str, Callable[[], str]]] = [
            ("abort", lambda: describe_abort(abort, time.monotonic())),
            ("threads", lambda: thread_stacks(_abort_mark(abort))),
            (f"{self._smi} (live)", lambda: nvidia_smi_read(self._smi, self._smi_timeout_s)),
            ("running jobs", self._jobs),
            ("processes in uninterruptible sleep (D)", uninterruptible_processes),
            ("recent kernel log", self._kernel),
        ]
        parts = [header(abort)]
        for title, gather in sections:
            parts += [f"--- {title} ---", _guarded(gather)]
        return "\n".join(parts)

    def _jobs(self) -> str:
        if self._running_jobs is None:
            return "no running-jobs provider registered"
        return describe_jobs(self._running_jobs())

    def _kernel(self) -> str:
        if self._kernel_lines is None:
            return "no kernel-log provider registered"
        lines = self._kernel_lines()[-_MAX_KERNEL_LINES:]
        return "\n".join(lines) or "no recent kernel lines"


def _abort_mark(abort: WatchedAbort) -> dict[int, str]:
    return {abort.thread_ident: "the wedged abort"} if abort.thread_ident is not None else {}


def _guarded(gather: Callable[[], str]) -> str:
    try:
        return gather()
    except Exception as exc:  # one broken source must not cost the rest of the report
        return f"(unavailable: {type(exc).__name__}: {exc})"


def _task_state(native_id: int) -> str:
    """The kernel's view of one of our threads: a thread stuck in a driver call shows D."""
    stat = _read_proc(f"/proc/self/task/{native_id}/stat")
    # The state follows the ")" that closes the command name, which may hold spaces.
    state = stat.rpartition(")")[2].split()[:1]
    wchan = _read_proc(f"/proc/self/task/{native_id}/wchan")
    return f" [kernel state {state[0] if state else '?'}, wchan {wchan or '?'}]"


def _read_proc(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())
