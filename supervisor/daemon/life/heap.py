"""The daemon's heap given back to the kernel: glibc keeps the pages of what Python frees,
and they would count in gpusvd's RSS for good."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

IDLE_SLACK = 4 << 20  # RSS grown by this much over its idle floor: trimmed once idle


def return_free_memory() -> None:
    """Hand the heap's free pages back to the kernel (glibc's `malloc_trim(0)`): after
    start-up (compiling and importing a few hundred modules leaves megabytes of free
    chunks that the running daemon never reuses), after a big request (a batch of
    100,000 jobs, its parse and its answer) and when the daemon falls idle after work."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], object] | None:
    """glibc's malloc_trim, looked up once; None where the C library has none."""
    import ctypes

    try:
        trim: Callable[[int], object] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to return
        return None
    return trim


def rss_bytes() -> int:
    """This process's resident set (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class IdleTrim:
    """Trims the heap when the daemon has no job left (none running, none queued) and its
    RSS is IDLE_SLACK over its floor (the least it was seen idle, or what the last trim
    left): what the jobs of a batch held (their records, messages, views) is freed by
    then. Only then: a daemon that runs one job at a time falls idle after each, and need
    not pay a trim for each."""

    def __init__(
        self,
        trim: Callable[[], None] = return_free_memory,
        rss: Callable[[], int] = rss_bytes,
        slack: int = IDLE_SLACK,
    ) -> None:
        self.trim, self.rss, self.slack = trim, rss, slack
        self.floor = rss()

    def seen(self, jobs: int) -> bool:
        """`jobs`: the daemon's running and queued jobs now. Whether it trimmed."""
        if jobs:
            return False
        now = self.rss()
        if now <= self.floor + self.slack:
            self.floor = min(self.floor, now)
            return False
        self.trim()
        self.floor = self.rss()
        return True
