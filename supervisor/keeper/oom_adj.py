"""A job's processes' oom_score_adj, written one by one: the kernel ranks each process
alone, so the leader's value alone would leave its children at the default."""

from __future__ import annotations

import os


def write_oom_score_adj(pids: list[int], value: int) -> list[str]:
    """Write `value` for each pid; what failed, other than a process already gone."""
    failures = []
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(value).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            if not isinstance(exc, ProcessLookupError | FileNotFoundError):
                failures.append(f"pid {pid}: {exc.strerror}")
    return failures
