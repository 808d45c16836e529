"""The OOM ranking kept over the running jobs: the newest dispatched job's tree at 1000,
every other job's at the base value, so that the kernel kills the newest first (who
that is: core/oom.py). Kept as jobs start and end, and only a job whose value changes
is written, its pids read from its cgroup: a start lowers the one job that was newest
(or the new one, when a job dispatched after it started first), and the end of the
newest promotes the next newest. A start reads no other job: rank() went through all
of them at every start (30-40 us a job with two lines of 32 running)."""

from __future__ import annotations

import structlog

from supervisor.core import oom as ranking
from supervisor.daemon.running import oom_scores as oom
from supervisor.daemon.running.procs import Proc

log = structlog.get_logger("gpusvd.attempts")


class OomRank:
    def __init__(self, procs: dict[int, Proc], base: int) -> None:
        self.procs = procs  # the runner's running attempts, by job id
        self.base = base
        self.top: int | None = None  # the job at NEWEST, as last ranked
        self.known = True  # every job's value as last written (not after a take-back)

    def all(self) -> None:
        """Every job ranked again from its dispatch order."""
        newest = ranking.newest_job({p.job_id: p.seq for p in self.procs.values()})
        for p in list(self.procs.values()):
            self._set(p, ranking.NEWEST if p.job_id == newest else self.base)
        self.top, self.known = newest, True

    def started(self, p: Proc) -> None:
        """`p` has just joined the running jobs, at NEWEST (its keeper set that before
        exec)."""
        top = self.procs.get(self.top) if self.top is not None else None
        if not self.known or (top is None and len(self.procs) > 1):
            self.all()  # taken back, or the newest left without an end seen here
        elif top is None or p.seq > top.seq:
            if top is not None:
                self._set(top, self.base)
            self._set(p, ranking.NEWEST)
            self.top = p.job_id
        else:
            self._set(p, self.base)

    def ended(self, job_id: int) -> None:
        """`job_id` has left the running jobs: if it was the newest, the next newest
        takes its place (after a take-back, what was newest is not known: all again)."""
        if job_id == self.top or not self.known:
            self.all()

    def _set(self, p: Proc, value: int) -> None:
        if p.oom_score_adj == value:
            return
        if p.leader_ended or p.handle.ended is not None:
            p.oom_score_adj = value  # nothing to rank: its leftovers are killed at its end
            return
        failures = oom.apply(dict.fromkeys(p.handle.pids_now(), value))
        p.oom_score_adj = value
        if failures:
            log.debug("oom_score_adj not applied", failures=failures[:5])
