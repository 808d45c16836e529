"""What a hang record holds: the job, its attempt and evidence, and the machine as read
when the hang was seen."""

from __future__ import annotations

from supervisor.core.commands import Now, RecordHang
from supervisor.core.jobs import Job
from supervisor.core.records import Attempt


def hang_record(
    job: Job, attempt: Attempt, machine: dict[str, object] | None, now: Now
) -> RecordHang:
    """The job, its attempt and evidence, and the machine as read when the hang was seen."""
    m = dict(machine or {})
    return RecordHang(
        {
            **m,
            "job": job.id,
            "attempt": attempt.n,
            "gpu": m.get("gpu", attempt.gpus[0] if attempt.gpus else None),
            "at": m.get("at") or now.iso,
            "evidence": attempt.evidence,
            "labels": dict(job.spec.labels),
            "name": job.spec.name or None,
            "frame": job.progress,
        }
    )
