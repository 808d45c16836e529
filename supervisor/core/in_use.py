"""What the running and claimed jobs take, as admission counts it: one RunningJob each,
from the engine's table."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from supervisor.core.admission import RunningJob
from supervisor.core.jobs import Job
from supervisor.core.reservation import time_left_s
from supervisor.core.table import Live


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
