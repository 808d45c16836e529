"""What the running and claimed jobs take, as admission counts it: one RunningJob each,
from the engine's table, and their sum (InUse)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from supervisor.core.jobs import Job
from supervisor.core.reservation import time_left_s
from supervisor.core.table import Live


@dataclass(frozen=True)
class HostMemory:
    limit_mb: int  # the most RAM all jobs together may use
    available_mb: int  # MemAvailable now
    reserve_mb: int  # kept free for the system


class RunningJob(NamedTuple):  # a tuple: made for every live job each dispatch round
    job_id: int
    projected_mb: int | None
    rss_mb: int  # the tree's RSS now
    gpus: tuple[int, ...]
    vram_reserved_mb: int  # per card
    shared: bool = False  # may have company on its card
    array: int | None = None
    ends_in_s: float | None = None  # until its --time ends it; None: no limit, or unknown


def free_for_new_mb(host: HostMemory, running: Sequence[RunningJob]) -> int:
    """Host RAM a new job may still take (InUse.free_for_new_mb)."""
    return InUse.of(running).free_for_new_mb(host)


@dataclass
class InUse:
    """What the running jobs take, summed once: the RAM booked for them and what they
    have yet to grow into, the VRAM each reserved, which share their card, how many of
    each array run. The plans of one dispatch round share one, each claim added to it as
    it is made (add), so that a plan costs nothing per running job."""

    running: list[RunningJob] = field(default_factory=list)
    booked_mb: int = 0  # each job's projection, or its RSS if more
    growth_mb: int = 0  # what jobs have yet to grow into, up to their projections
    vram_mb: dict[int, int] = field(default_factory=dict)  # job id -> reserved per card
    shared: set[int] = field(default_factory=set)  # job ids that may have company
    arrays: Counter[int] = field(default_factory=Counter)  # array id -> its jobs running

    @classmethod
    def of(cls, running: Iterable[RunningJob]) -> InUse:
        use = cls()
        for job in running:
            use.add(job)
        return use

    def add(self, job: RunningJob) -> None:
        self.running.append(job)
        expected = _expected(job)
        self.booked_mb += max(expected, job.rss_mb)
        self.growth_mb += max(0, expected - job.rss_mb)
        self.vram_mb[job.job_id] = job.vram_reserved_mb
        if job.shared:
            self.shared.add(job.job_id)
        if job.array is not None:
            self.arrays[job.array] += 1

    def free_for_new_mb(self, host: HostMemory) -> int:
        """Host RAM a new job may still take.

        Two views, the stricter wins: the ledger (limit minus what each running job is
        projected to reach, or already uses if more) and the machine (MemAvailable minus
        what running jobs have yet to grow into). A job without a projection counts as
        its RSS. The reserve comes off the result.
        """
        ledger = host.limit_mb - self.booked_mb
        return min(ledger, host.available_mb - self.growth_mb) - host.reserve_mb


def _expected(job: RunningJob) -> int:
    return job.rss_mb if job.projected_mb is None else job.projected_mb


def running_jobs(
    lives: Mapping[int, Live], jobs: Mapping[int, Job], rss_mb: Callable[[int], int], now: float
) -> list[RunningJob]:
    """Each live job's projected and current RAM, cards, reserved VRAM, sharing, array
    and the seconds until its `--time` ends it."""
    out = []
    for job_id, r in lives.items():
        job = jobs.get(job_id)
        out.append(
            RunningJob(
                job_id=job_id,
                projected_mb=r.projection.projected_mb if r.projection else None,
                rss_mb=rss_mb(job_id),
                gpus=r.cards,
                vram_reserved_mb=r.vram_reserved_mb,
                shared=job.spec.share if job else False,
                array=job.spec.array_id if job else None,
                ends_in_s=time_left_s(job_id, lives, jobs, now),
            )
        )
    return out
