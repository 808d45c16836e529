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
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil

from supervisor.core.jobs import ExitStatus

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
    who = "" if uid is None else f" as uid {uid}"
    why = f"gpusv: cannot enter working directory {cwd}{who}: ".encode(errors="replace")

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
        try:
            os.chdir(cwd)
        except OSError as exc:  # the parent only learns that the child failed: say why here
            os.write(2, why + (exc.strerror or "error").encode() + b"\n")
            raise

    return child


def _open_log(path: Path, uid: int | None, gid: int | None) -> int:
    """The job's output file, private to the job's user: output may echo its secrets, and
    a primary group is often shared ("users"), so not even the group may read it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # also a file left by an older attempt or version
    if uid is not None and os.geteuid() == 0:
        os.fchown(fd, uid, gid if gid is not None else -1)
    return fd


class _Owned:
    """Leaders whose exit status a ProcessHandle collects, and spawns in flight: spawn()
    runs on a worker thread, so until it returns its child's pid is known to nobody. An
    exited child of ours may be reaped as an orphan only when it is neither."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pids: set[int] = set()
        self.in_flight = 0

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        with self.lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1

    def add(self, pid: int) -> None:
        with self.lock:
            self.pids.add(pid)

    def discard(self, pid: int) -> None:
        with self.lock:
            self.pids.discard(pid)


_OWNED = _Owned()


def _owned_popen(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
    with _OWNED.spawning():
        popen = subprocess.Popen(argv, **options)
        _OWNED.add(popen.pid)
    return popen


def spawn(spec: LaunchSpec) -> ProcessHandle:
    """Start the job in a session of its own. Raises SpawnError with a readable reason.

    Blocking until the child has exec'd (a fork of the whole daemon, then the preexec
    hook): the daemon calls it on a worker thread."""
    if (spec.uid is None) != (spec.gid is None):
        raise SpawnError("internal: a job's uid and gid are set together or not at all")
    # Checked by the daemon only when the job runs as the daemon's own user: for another
    # user, root's answer would tell them about directories they cannot see themselves.
    if spec.uid is None and not os.path.isdir(spec.cwd):
        raise SpawnError(f"working directory {spec.cwd} does not exist")
    try:
        out = _open_log(spec.stdout, spec.uid, spec.gid)
    except OSError as exc:
        raise SpawnError(f"cannot open the job's output file: {exc.strerror}") from None
    try:
        err = _open_log(spec.stderr, spec.uid, spec.gid)
    except OSError as exc:
        os.close(out)
        raise SpawnError(f"cannot open the job's output file: {exc.strerror}") from None
    try:
        popen = _owned_popen(
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
        who = "" if spec.uid is None else f" as uid {spec.uid}"
        raise SpawnError(
            f"cannot enter working directory {spec.cwd}{who}: missing or not permitted "
            "(the job's stderr says which)"
        ) from None
    except OSError as exc:
        raise SpawnError(f"cannot start {spec.argv[0]}: {exc.strerror}") from None
    except ValueError as exc:  # e.g. a character that the OS cannot take in argv or env
        raise SpawnError(f"cannot start {spec.argv[0][:80]}: {exc}") from None
    finally:
        os.close(out)
        os.close(err)
    return ProcessHandle(popen, spec.job_id)


class ProcessTable:
    """The daemon's descendants with their parents, from one pass over /proc.

    Finding a tree means knowing every process's parent, which costs a read per process
    on the host; a table shares that pass between all the trees wanted at one moment.
    Every job process descends from the daemon (it is a subreaper: orphans come back to
    it), so the table holds only those.
    """

    def __init__(self) -> None:
        self.me = os.getpid()
        self.procs: dict[int, psutil.Process] = {}
        self.kids: dict[int, list[int]] = {}
        self._jobs: dict[int, int | None] = {}
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.me).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.kids.setdefault(proc.ppid(), []).append(proc.pid)
                    self.procs[proc.pid] = proc

    def children(self, pid: int) -> list[psutil.Process]:
        return [self.procs[child] for child in self.kids.get(pid, ())]

    def descendants(self, root: psutil.Process) -> list[psutil.Process]:
        """As psutil's children(recursive=True), from the table when it holds the root."""
        if root.pid not in self.procs:  # gone, or not ours (no subreaper): ask psutil
            with contextlib.suppress(psutil.Error):
                if root.is_running():
                    return list(root.children(recursive=True))
            return []
        try:
            born = root.create_time()
            if self.procs[root.pid].create_time() != born:  # the pid was reused
                return []
        except psutil.Error:
            return []
        found: list[psutil.Process] = []
        seen, stack = {root.pid}, [root.pid]
        while stack:
            for child in self.kids.get(stack.pop(), ()):
                proc = self.procs[child]
                with contextlib.suppress(psutil.Error):
                    if child not in seen and proc.create_time() >= born:
                        seen.add(child)
                        found.append(proc)
                        stack.append(child)
        return found

    def job_of(self, pid: int) -> int | None:
        if pid not in self._jobs:
            self._jobs[pid] = job_of(pid)
        return self._jobs[pid]


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
                    _OWNED.discard(pid)
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

    def adopted(self, table: ProcessTable | None = None) -> list[psutil.Process]:
        """Orphans of this job that were re-parented to us (we are a subreaper)."""
        table = table or ProcessTable()
        return [
            child
            for child in table.children(table.me)
            if child.pid != self.pid and table.job_of(child.pid) == self.job_id
        ]

    def tree(self, table: ProcessTable | None = None) -> list[psutil.Process]:
        """Every live process of the job. Pass one `table` to find many jobs' trees from a
        single read of /proc."""
        table = table or ProcessTable()
        procs: dict[int, psutil.Process] = {}
        roots = [p for p in (self.leader, *self.known.values(), *self.adopted(table)) if p]
        for proc in roots:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    procs[proc.pid] = proc
            for child in table.descendants(proc):
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
    reaped: list[int] = []
    with _OWNED.lock:
        if _OWNED.in_flight:  # a new leader not yet known: try again next time
            return reaped
        leaders = leaders | _OWNED.pids
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
