"""Process ownership: spawn a job, watch it through a pidfd, kill its whole tree.

Everything that touches a job's processes lives here behind `spawn` and `ProcessHandle`,
so that a per-job shim that outlives the daemon can replace it without touching the
scheduler.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import psutil

from .jobs import ExitStatus

PR_SET_CHILD_SUBREAPER = 36


class SpawnError(Exception):
    """The command could not be started; the message says why, for the user."""


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt: int
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    stdout: Path
    stderr: Path
    uid: int | None = None  # None: run as the daemon's own user
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    oom_score_adj: int | None = None


def _preexec(spec: LaunchSpec) -> Callable[[], None]:
    """Runs in the child between fork and exec, in this order: raise oom_score_adj while
    still privileged (after a uid change /proc/self is no longer ours to write), drop to
    the submitter, then enter the cwd *as the submitter* so root cannot lend its access."""
    value = None if spec.oom_score_adj is None else str(spec.oom_score_adj).encode()
    uid, gid, groups, cwd = spec.uid, spec.gid, spec.groups, spec.cwd

    def child() -> None:
        if value is not None:
            with contextlib.suppress(OSError):
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                os.write(fd, value)
                os.close(fd)
        if uid is not None and gid is not None:
            os.setgroups(list(groups or ()))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        os.chdir(cwd)

    return child


def _open_log(path: Path, uid: int | None, gid: int | None) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    if uid is not None and os.geteuid() == 0:
        os.fchown(fd, uid, gid if gid is not None else -1)
    return fd


def spawn(spec: LaunchSpec) -> ProcessHandle:
    """Start the job in a session of its own. Raises SpawnError with a readable reason."""
    if not os.path.isdir(spec.cwd):
        raise SpawnError(f"working directory {spec.cwd} does not exist")
    out = _open_log(spec.stdout, spec.uid, spec.gid)
    err = _open_log(spec.stderr, spec.uid, spec.gid)
    try:
        popen = subprocess.Popen(
            list(spec.argv),
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_preexec(spec),
        )
    except FileNotFoundError:
        raise SpawnError(f"executable not found: {spec.argv[0]}") from None
    except PermissionError:
        raise SpawnError(f"permission denied executing {spec.argv[0]}") from None
    except subprocess.SubprocessError:
        raise SpawnError(
            f"could not enter {spec.cwd} or switch to uid {spec.uid} before exec"
        ) from None
    except OSError as exc:
        raise SpawnError(f"cannot start {spec.argv[0]}: {exc.strerror}") from None
    finally:
        os.close(out)
        os.close(err)
    return ProcessHandle(popen, spec.job_id)


@dataclass
class ProcessHandle:
    popen: subprocess.Popen[bytes]
    job_id: int
    known: dict[int, psutil.Process] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pid = self.popen.pid
        self.pidfd = os.pidfd_open(self.pid)
        try:
            self.leader: psutil.Process | None = psutil.Process(self.pid)
            self.start_time = self.leader.create_time()
        except psutil.Error:  # already gone: still reaped through the pidfd
            self.leader, self.start_time = None, time.time()
        self.status: ExitStatus | None = None

    async def wait(self) -> ExitStatus:
        """Wait for the leader to exit without a thread: the pidfd becomes readable."""
        try:
            while self.status is None:
                await anyio.wait_readable(self.pidfd)
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.status = ExitStatus.from_wait_status(status)
                    self.popen.returncode = self.status.shell_code
        finally:
            if self.status is not None:
                os.close(self.pidfd)
                self.pidfd = -1
        return self.status

    def remember(self, pids: Iterable[int]) -> None:
        """Pids the sampler saw in the tree: kept so that escaped descendants still die."""
        for pid in pids:
            if pid not in self.known:
                with contextlib.suppress(psutil.Error):
                    self.known[pid] = psutil.Process(pid)

    def adopted(self) -> list[psutil.Process]:
        """Orphans of this job that were re-parented to us (we are a subreaper)."""
        found = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid != self.pid and job_of(child.pid) == self.job_id:
                    found.append(child)
        return found

    def tree(self) -> list[psutil.Process]:
        procs: dict[int, psutil.Process] = {}
        roots = [p for p in (self.leader, *self.known.values(), *self.adopted()) if p]
        for proc in roots:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    procs[proc.pid] = proc
                for child in proc.children(recursive=True):
                    procs.setdefault(child.pid, child)
        return list(procs.values())

    def signal_tree(self, sig: int) -> None:
        tree = self.tree()  # before any signal: a dead parent hides its children
        self.remember(p.pid for p in tree)
        if self.status is None:  # the group id is ours only until the leader is reaped
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)

    def kill_tree(self, grace_s: float, poll_s: float = 0.05) -> list[psutil.Process]:
        """SIGTERM the tree, SIGKILL what is left after the grace, then wait until every
        process is gone. Blocking and unbounded on purpose: a process in D state never
        dies, and the caller runs this under the deadman. Returns survivors of SIGTERM."""
        self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.tree() and time.monotonic() < deadline:
            time.sleep(poll_s)
        survivors = self.tree()
        while survivors:
            self.signal_tree(signal.SIGKILL)
            time.sleep(poll_s)
            survivors = self.tree()
        return survivors


def kill_leftover(pid: int, start_time: float | None) -> bool:
    """Kill the process group of an attempt from an earlier incarnation, if the same process
    (same pid *and* start time) is still alive. True if something was killed."""
    try:
        proc = psutil.Process(pid)
        if start_time is not None and abs(proc.create_time() - start_time) > 1.0:
            return False
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + 5.0
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def _alive(proc: psutil.Process) -> bool:
    """A zombie is dead for our purposes: its reaper may not be us (or may never come)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def become_subreaper() -> bool:
    """Orphaned descendants of jobs are re-parented to us instead of init, so a job's tree
    stays findable after its middle process exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(leaders: set[int]) -> list[int]:
    """Reap adopted orphans that exited (zombies that are not job leaders)."""
    reaped = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid in leaders:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
                    reaped.append(child.pid)
    return reaped


def job_of(pid: int) -> int | None:
    """GPUSV_JOB_ID from a process's environment: finds descendants that escaped."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"GPUSV_JOB_ID="):
                    return int(item[13:])
    except (OSError, ValueError):
        return None
    return None
