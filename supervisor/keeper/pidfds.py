"""Signals to a job's processes, each through a pidfd: never by a bare pid that may have
been reaped and given to another process, and never pid 0 or a group of 0.

- A process read from a list (`cgroup.procs`, the children lists of /proc) is opened as
  a pidfd first, and signalled only if it is still what the list said once the pidfd
  holds it: still listed in the job's cgroup, or still started at the same clock tick.
- A process group is signalled only while its leader's pidfd shows the leader alive and
  the group is the leader's own (pgid == pid): a live leader keeps its pid, and so its
  group's id, from being given to anyone else.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterable


def alive(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def send(pidfd: int, sig: int) -> bool:
    """Whether the signal went (False: the process has exited)."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def open_pid(pid: int) -> int | None:
    if pid <= 0:  # 0 and below name groups or every process: never ours to signal
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def send_checked(pids: Iterable[int], sig: int, still: Callable[[list[int]], set[int]]) -> int:
    """Signal each pid that `still` confirms once a pidfd holds it; how many were."""
    held: dict[int, int] = {}
    try:
        for pid in pids:
            fd = open_pid(pid)
            if fd is not None:
                held[pid] = fd
        confirmed = still(list(held)) if held else set()
        return sum(send(fd, sig) for pid, fd in held.items() if pid in confirmed)
    finally:
        for fd in held.values():
            os.close(fd)


def in_list(listed: Callable[[], list[int]]) -> Callable[[list[int]], set[int]]:
    """Still listed (in the job's cgroup): a pid read from it before its pidfd was
    opened may have been reaped and reused meanwhile, by a process outside the job."""
    return lambda _pids: set(listed())


def same_start(ticks: dict[int, int | None]) -> Callable[[list[int]], set[int]]:
    """Still started at the tick read before its pidfd was opened: the same process."""
    return lambda pids: {p for p in pids if ticks.get(p) is not None and start_ticks(p) == ticks[p]}


def signal_listed(listed: Callable[[], list[int]], sig: int) -> int:
    """Every process a list names (a cgroup's `cgroup.procs`), each only if the list
    still names it once its pidfd is open; how many were signalled."""
    return send_checked(listed(), sig, in_list(listed))


def signal_started(found: list[int], sig: int) -> int:
    """Processes found some other way (a tree's children lists), each only if it still
    started at the same tick once its pidfd is open."""
    ticks = {pid: start_ticks(pid) for pid in found}
    return send_checked(found, sig, same_start(ticks))


def signal_group_of(leader_fd: int, leader: int, sig: int, *, unreaped: bool = False) -> bool:
    """The leader's own process group (its session: a job starts as one), while the
    leader lives and leads it. `unreaped`: the leader is the keeper's own child, not
    reaped yet (a zombie holds its pid too, so its group's id is still the job's)."""
    if leader <= 0 or not (unreaped or alive(leader_fd)):
        return False
    with contextlib.suppress(OSError):
        if os.getpgid(leader) == leader and (unreaped or alive(leader_fd)):
            os.killpg(leader, sig)
            return True
    return False


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot.
    A pid with the same start is the same process (pids are reused, this is not)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(data[data.rindex(b")") + 2 :].split()[19])
