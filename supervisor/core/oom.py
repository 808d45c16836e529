"""Who the kernel's OOM killer takes first, and who the daemon stops first in a squeeze.

Pure ranking (the writes to /proc are daemon/running/oom_scores.py's). The newest running job gets
oom_score_adj 1000; every process of every other job gets the base value (0, or the
daemon's own value when that is higher). The kernel ranks processes by RSS plus
oom_score_adj/1000 of the memory it is short of, so 1000 against 0 outweighs any
difference in RSS: the newest job dies first whatever its size. The +100 it replaces was
worth only a tenth of RAM (~12.5 GB on a 125 GB host), which a 63 GB older job outscored.
The rules are described for operators in docs/host-memory.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

NEWEST = 1000
BASE = 0


def oom_adjustments(
    new_job_pids: Iterable[int],
    running_trees: Mapping[int, Iterable[int]],
    *,
    base: int = BASE,
) -> dict[int, int]:
    """pid -> oom_score_adj: the newest job's tree at 1000, every other job's at `base`.

    Call it when a job is dispatched (its new tree), when the newest job ends (the next
    newest is promoted, so that the order survives), and for processes that appear in an
    older tree later (a child forked before its parent was lowered inherited 1000).
    """
    values = {pid: base for pids in running_trees.values() for pid in pids}
    values.update(dict.fromkeys(new_job_pids, NEWEST))
    return values


def base_value(own_value: int) -> int:
    """What older jobs are set to, given the daemon's own oom_score_adj.

    Without CAP_SYS_RESOURCE a process may lower a value only down to the lowest one
    a privileged writer gave it, and jobs inherit that floor from the daemon. The
    daemon's own value is always at or above its floor, so older jobs can always go
    back to max(0, daemon's value), even from 1000 and even unprivileged.
    """
    return max(BASE, own_value)


def newest_job(dispatched: Mapping[int, int]) -> int | None:
    """job id -> dispatch sequence number: the job that must die first."""
    return max(dispatched, key=lambda job: dispatched[job]) if dispatched else None


def squeeze_victims(
    available_mb: int, squeeze_below_mb: int, running: Sequence[tuple[int, int, int]]
) -> list[int]:
    """Jobs to stop, newest first, when MemAvailable fell under `squeeze_below_mb`.

    running: (job id, dispatch sequence number, RSS MB). As many of the most recently
    dispatched jobs as it takes to bring MemAvailable back over the line, at least one.
    """
    if available_mb >= squeeze_below_mb:
        return []
    victims: list[int] = []
    freed = 0
    for job_id, _, rss_mb in sorted(running, key=lambda r: (r[1], r[0]), reverse=True):
        victims.append(job_id)
        freed += rss_mb
        if available_mb + freed >= squeeze_below_mb:
            break
    return victims


def oom_source(
    *, sigkill: bool, own: int | None, in_kernel_log: bool, daemon_moved: bool, squeezed: bool
) -> str | None:
    """Why an attempt's end counts as an OOM kill (its `evidence` source), or None.

    own: the OOM kills its own cgroup counted (None where it has no such counter); it
    decides first, whatever the exit looks like (the kernel may have killed a child only).
    Otherwise only a SIGKILL can be one: its pid in a kernel OOM line; the daemon's
    cgroup counter moved since it started, which is evidence only where the job has no
    counter of its own (else it moved for another job); or a memory squeeze just before
    (a userspace OOM killer sends SIGKILL and moves no counter)."""
    if own:
        return "job_cgroup_oom_kill"
    if not sigkill:
        return None
    if in_kernel_log:
        return "kernel_log"
    if own is None and daemon_moved:
        return "cgroup_oom_kill"
    return "memory_squeeze" if squeezed else None
