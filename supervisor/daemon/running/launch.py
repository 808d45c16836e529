"""What the daemon still does to processes itself: kill what an attempt started before
keepers left behind; and who a job runs as. (A start is a `supervisor.keeper.spawn.Spec`,
sent to a keeper.)"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import time

import psutil


class SpawnError(Exception):
    """The command could not be started; the message says why, for the user. With
    `transient`, for a passing cause: the attempt is retried (`spawn_retry`). `kind` names
    a kind of failure the operator must see (`cgroup`: the job's cgroup could not be
    made, so it was not started), None for the job's own (a missing executable)."""

    def __init__(self, message: str, *, transient: bool = False, kind: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.kind = kind


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


def user_of(uid: int) -> tuple[dict[str, str], int | None, int | None, tuple[int, ...] | None]:
    """The identity a job runs with: a root daemon becomes the submitter; a non-root
    daemon can only run jobs as itself, and the server accepts only its own uid."""
    if os.geteuid() != 0 or uid == os.geteuid():
        return {}, None, None, None
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:  # never fall back to root's identity; nor guess one
        raise SpawnError(f"uid {uid} has no passwd entry: cannot set up its groups") from None
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    env = {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}
    return env, uid, entry.pw_gid, groups
