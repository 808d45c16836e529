"""One cgroup per job: made by the keeper before the job's command runs.

A job may get two: a unified (v2) cgroup, for membership (`cgroup.procs`), an atomic
`cgroup.kill` and, where v2 has the memory controller, `memory.peak`, `memory.events`
and `memory.oom.group`; and a v1 memory cgroup where v1 holds the memory controller,
for `memory.max_usage_in_bytes` and `memory.oom_control`. The path is a function of the
attempt alone (`job-<id>-<attempt>` under each root), so whoever knows the attempt can
find its processes: they cannot leave a cgroup by clearing their environment or by
calling setsid. A keeper given no root (a host where gpusvd has no cgroup to delegate)
falls back to the process tree (the session, and the children that /proc lists for
each process), and says so once in its log; a keeper given a root never does: a job
whose group cannot be made under it is refused (Unavailable), not run outside it.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from . import pidfds
from .answers import Refused

# Plain str paths: pathlib's objects cost more than the syscalls they name on the spawn
# path. Functions called from outside (empty_out) still take a Path.


class Roots(NamedTuple):
    """Where job cgroups are made: directories the keeper may create children in."""

    v2: str | None = None
    memcg: str | None = None


class Groups(NamedTuple):
    """The cgroups of one job; None where that kind could not be made."""

    v2: str | None = None
    memcg: str | None = None

    @property
    def any(self) -> bool:
        return self.v2 is not None or self.memcg is not None


def name(job: int, attempt: int) -> str:
    return f"job-{job}-{attempt}"


# Whether a v2 root hands its children the memory controller, by root, learnt from its
# first job: the keeper sets that up at its start (__main__), so it holds for its life.
_v2_memory: dict[str, bool] = {}


class Busy(Exception):
    """A job's cgroup exists and still holds processes (a start whose keeper died before
    the command could run): they are being killed; the start may be tried again."""


class Unavailable(Refused):
    """A job's cgroup cannot be made under a root the keeper was given: the job is not
    started (it would run outside any cgroup of ours, where nothing could find it). Its
    spawn is refused with the code `cgroup`, the reason said in the keeper's log too."""

    def __init__(self, message: str, warn: Callable[[str], None]) -> None:
        super().__init__("cgroup", message)
        warn(f"job refused: {message}")


def make(roots: Roots, job: int, attempt: int, warn: Callable[[str], None]) -> Groups:
    """The job's cgroups, empty, not yet configured. A directory that exists already is
    left from a start whose keeper died before the command could run: what is in it is
    killed, and while anything is left the start is refused (Busy), not waited for. A
    root that has vanished (a restart under systemd may remove the service's cgroup
    tree) is made again first; where a group still cannot be made, Unavailable."""
    v2 = None if roots.v2 is None else _make(roots.v2, name(job, attempt), warn)
    memcg = None if roots.memcg is None else _make(roots.memcg, name(job, attempt), warn)
    return Groups(v2, memcg)


def _make(root: str, leaf: str, warn: Callable[[str], None]) -> str:
    path = f"{root}/{leaf}"
    try:
        os.mkdir(path)
    except FileExistsError:
        if pids(Groups(v2=path)):
            kill_all(Groups(v2=path))
            raise Busy(f"cannot start the job yet: cgroup {path} still holds processes") from None
    except FileNotFoundError:
        made = ensure_root(root, warn)
        try:
            os.mkdir(path)
        except OSError as exc:
            why = made or exc.strerror
            raise Unavailable(f"cannot make cgroup {path}: {why}", warn) from None
    except OSError as exc:
        raise Unavailable(f"cannot make cgroup {path}: {exc.strerror}", warn) from None
    return path


def ensure_root(root: str, warn: Callable[[str], None]) -> str | None:
    """Make a keeper's cgroup root (again), with the memory controller offered to its
    children where its parent has it; None once it exists, else why it could not be
    made. Said in the keeper's log either way: a root made again means something
    removed it under us."""
    existed = os.path.isdir(root)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        warn(f"cannot make cgroup root {root}: {exc.strerror}")
        return str(exc.strerror)
    if not existed:
        _v2_memory.pop(root, None)  # a new root: learnt again from its first job
        offer_memory(root, warn)
        warn(f"cgroup root {root} was missing: made again")
    return None


def offer_memory(root: str, warn: Callable[[str], None]) -> None:
    """v2: where the parent offers the memory controller, hand it down to the job
    cgroups (memory.peak, memory.events, memory.max, memory.oom.group). A v1 root has no
    cgroup.controllers: nothing to do."""
    for path in (root.rpartition("/")[0], root):
        try:
            offered = _read(f"{path}/cgroup.controllers").split()
            if "memory" in offered:
                _write(f"{path}/cgroup.subtree_control", "+memory")
        except OSError as exc:
            warn(f"cannot give job cgroups the memory controller at {path}: {exc}")
            return


def _has_memory(made: str) -> bool:
    """From a cgroup just made: one that is gone would tell nothing about its root."""
    root = made.rpartition("/")[0]
    known = _v2_memory.get(root)
    if known is None:
        known = _v2_memory[root] = os.path.exists(f"{made}/memory.max")
    return known


def configure(groups: Groups, mem_max: int | None) -> None:
    """The job's memory limit, and its OOM kills of the whole job."""
    if groups.v2 is not None and _has_memory(groups.v2):
        # Where the kernel OOM-kills inside the job, the whole job goes, not a part of it.
        _write(f"{groups.v2}/memory.oom.group", "1")
        if mem_max is not None:
            _write(f"{groups.v2}/memory.max", str(mem_max))
    elif groups.memcg is not None and mem_max is not None:
        _write(f"{groups.memcg}/memory.limit_in_bytes", str(mem_max))


def join_fds(groups: Groups) -> list[int]:
    """Descriptors of the groups' cgroup.procs, opened before the fork: the child joins by
    writing "0" (itself) to each, before it drops its privileges and before it execs."""
    fds: list[int] = []
    for path in (groups.v2, groups.memcg):
        if path is not None:
            fds.append(os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
    return fds


def pids(groups: Groups) -> list[int]:
    for path in (groups.v2, groups.memcg):
        if path is not None:
            try:
                return [int(line) for line in _read(f"{path}/cgroup.procs").split()]
            except ValueError:
                continue
    return []


def kill_v2(groups: Groups) -> bool:
    """v2's cgroup.kill: the whole job at once, atomic against forks; False where there
    is none (no v2 group, or before Linux 5.14)."""
    if groups.v2 is None:
        return False
    try:
        _write(f"{groups.v2}/cgroup.kill", "1")
    except OSError:
        return False
    return True


def kill_all(groups: Groups) -> None:
    """SIGKILL the whole job: cgroup.kill, else each process in cgroup.procs through a
    pidfd (pidfds.py), which the caller repeats until the group is empty."""
    if not kill_v2(groups):
        signal_groups(groups, signal.SIGKILL)


def signal_groups(groups: Groups, sig: int) -> int:
    """`sig` to every process of the job's cgroup, each through a pidfd (pidfds.py)."""
    return pidfds.signal_listed(lambda: pids(groups), sig)


def empty_out(path: str | Path, timeout_s: float = 5.0) -> bool:
    """Kill what a cgroup holds and wait until it is empty."""
    groups = Groups(v2=str(path))
    deadline = time.monotonic() + timeout_s
    while pids(groups):
        if time.monotonic() > deadline:
            return False
        kill_all(groups)
        time.sleep(0.01)
    return True


def remove_tree(path: str | Path) -> None:
    """Empty out and remove a cgroup and every group under it, deepest first: a keeper's
    root holds each job's group and a probe group left by a keeper killed while it
    probed, and a job may have made groups of its own. For whoever throws a keeper's
    roots away (the benchmark, tests); a keeper removes its own only when it leaves with
    nothing kept, and then they are empty. EBUSY is waited out: a killed process with
    threads leaves cgroup.procs while its threads still exit, and holds the group until
    they have (rmdir right after cgroup.procs showed empty: EBUSY 190 times in 200)."""
    deadline = time.monotonic() + 5.0
    while True:
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
        empty_out(path)
        try:
            os.rmdir(path)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


def memory(groups: Groups) -> tuple[int | None, int | None]:
    """(peak bytes, OOM kills) of the job: the kernel's own counts for its cgroup."""
    peak = oom = None
    v2 = groups.v2  # skipped where its root is known to lack the memory controller
    if v2 is not None and not _v2_memory.get(v2.rpartition("/")[0], True):
        v2 = None
    for path, peak_file, oom_file in (
        (v2, "memory.peak", "memory.events"),
        (groups.memcg, "memory.max_usage_in_bytes", "memory.oom_control"),
    ):
        if path is None:
            continue
        text = _read(f"{path}/{peak_file}").strip()
        if peak is None and text.isdigit():
            peak = int(text)
        count = parse_oom_kill(_read(f"{path}/{oom_file}"))
        if oom is None and count is not None:
            oom = count
    return peak, oom


def parse_oom_kill(text: str) -> int | None:
    """The `oom_kill N` count of a v2 memory.events or a v1 memory.oom_control text."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def remove(groups: Groups) -> bool:
    """Remove the job's cgroups; False while a process is still in one (EBUSY)."""
    done = True
    for path in (groups.v2, groups.memcg):
        if path is None:
            continue
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            done = False
    return done


def tree_pids(leader: int) -> list[int]:
    """The fallback without a cgroup: the leader's descendants, from the children lists
    that /proc keeps per thread (no scan of every process on the host)."""
    found: list[int] = []
    stack = [leader]
    while stack:
        for child in _children(stack.pop()):
            if child not in found:
                found.append(child)
                stack.append(child)
    return found


def orphan_pids(reaper: int, job: int, attempt: int) -> list[int]:
    """The fallback's escapees: children of `reaper` (the job's keeper, a child
    subreaper, which every process of the job whose parent died is re-parented to) that
    carry the attempt's GPUSV_JOB_ID and GPUSV_ATTEMPT in the environment they started
    with, and their descendants (the living leader is one of them too). A double fork
    into a new session leaves both the leader's tree and its session, but not that."""
    tags = {f"GPUSV_JOB_ID={job}".encode(), f"GPUSV_ATTEMPT={attempt}".encode()}
    found: list[int] = []
    for child in _children(reaper):
        env = _environ(child)
        if env is not None and tags <= set(env.split(b"\0")) and child not in found:
            found += [child, *(p for p in tree_pids(child) if p not in found)]
    return found


def _environ(pid: int, tries: int = 25) -> bytes | None:
    """The environment a process started with; None if gone or not ours. A process in
    the middle of an exec reads as empty (its new memory has no environment yet): read
    again for a few ms before taking it at its word."""
    for _ in range(tries):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            return None
        if env:
            return env
        time.sleep(0.002)
    return b""


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(c) for tid in tasks for c in _read(f"/proc/{pid}/task/{tid}/children").split()]


def _read(path: str | Path) -> str:
    """A small kernel file in one read (cheaper than open().read() on the spawn path)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 65536).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _write(path: str | Path, text: str) -> None:
    # One write() per value: cgroup files take a whole value per write call.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
