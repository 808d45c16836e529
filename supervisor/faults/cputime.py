"""CPU seconds used by a set of processes, from /proc (the watchdog's CPU half of "idle")."""

from __future__ import annotations

import os
from collections.abc import Iterable

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int], proc: str = "/proc") -> float:
    """utime + stime of each process (and of its reaped children), summed; a process that
    is gone counts nothing."""
    total = 0
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its end.
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        except ValueError:
            continue
    return total / _TICK
