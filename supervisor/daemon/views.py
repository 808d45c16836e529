"""The JSON objects that clients see (CONTRACT.md "The job object")."""

from __future__ import annotations

from typing import Any

from supervisor.core.jobs import Job
from supervisor.core.projection import Projection
from supervisor.daemon.store import Attempt

# What anyone who may connect can see of someone else's job: what it holds and why it
# waits, never its text (name, argv, cwd, labels may carry secrets; env is never shown).
PUBLIC_FIELDS = ("id", "state", "owner_uid", "gpus", "gpus_requested", "waiting_for")


def job_json(
    job: Job,
    *,
    host_memory: Projection | None,
    attempts: list[Attempt] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec = job.spec
    out: dict[str, Any] = {
        "id": job.id,
        "name": spec.name,
        "argv": list(spec.argv),
        "cwd": spec.cwd,
        "owner_uid": spec.owner_uid,
        "labels": dict(spec.labels),
        "mem_key": spec.mem_key,
        "state": job.state.value,
        "waiting_for": job.waiting_for,
        "gpus_requested": spec.gpus,
        "gpus": list(job.gpus),
        "host_memory": host_memory.to_json() if host_memory else None,
        "retries": {
            "ordinary": {"used": job.ordinary_used, "budget": spec.retries},
            "gpu_hang": {"used": job.gpu_hang_used, "budget": spec.gpu_hang_retries},
        },
        "reason": job.reason.value if job.reason else None,
        "exit_code": job.exit_code,
        "priority": spec.priority,
        "after": list(spec.after),
        "progress": job.progress,
        "vram_mb": spec.vram_mb,
        "share": spec.share,
        "array_id": spec.array_id,
        "array_index": spec.array_index,
        "max_running": spec.max_running,
        "mem_mb": spec.mem_mb,
        "mem_scale": spec.mem_scale,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "held": job.held,
        "time_limit_s": spec.time_limit_s,
    }
    if attempts is not None:
        out["attempts"] = [a.to_json() for a in attempts]
    if events is not None:
        out["events"] = events
    return out


def public_view(full: dict[str, Any]) -> dict[str, Any]:
    return {k: full[k] for k in PUBLIC_FIELDS}
