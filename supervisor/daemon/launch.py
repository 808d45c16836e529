"""What a job's start needs (`LaunchSpec`), handed to its keeper, and the one thing the
daemon still does to processes itself: kill what an attempt from before keepers left."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


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
