"""The JSON objects that clients see (CONTRACT.md "The job object")."""

from __future__ import annotations

from typing import Any, cast

from supervisor.core.jobs import Job
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt
from supervisor.core.table import Phase, Table
from supervisor.wire.shapes import AttemptJson, HostMemory, JobJson, PublicJobJson

# What anyone who may connect can see of someone else's job: what it holds, why it waits
# and since when, never its text (name, argv, cwd, labels may carry secrets; env is never
# shown).
PUBLIC_FIELDS = (
    "id",
    "state",
    "owner_uid",
    "gpus",
    "gpus_requested",
    "waiting_for",
    "submitted_at",
)


def job_json(
    job: Job,
    *,
    host_memory: Projection | None,
    attempts: list[Attempt] | None = None,
    events: list[dict[str, Any]] | None = None,
    stopping: bool = False,
    starting: bool = False,
) -> JobJson:
    spec = job.spec
    out: JobJson = {
        "id": job.id,
        "name": spec.name,
        "argv": list(spec.argv),
        "cwd": spec.cwd,
        "owner_uid": spec.owner_uid,
        "labels": dict(spec.labels),
        "mem_key": spec.mem_key,
        "state": job.state.value,
        "stopping": stopping,
        "starting": starting,
        "waiting_for": job.waiting_for,
        "gpus_requested": spec.gpus,
        "gpus": list(job.gpus),
        "host_memory": _memory(host_memory),
        "retries": {
            "ordinary": {"used": job.ordinary_used, "budget": spec.retries},
            "gpu_hang": {"used": job.gpu_hang_used, "budget": spec.gpu_hang_retries},
        },
        "reason": job.reason.value if job.reason else None,
        "exit_code": job.exit_code,
        "priority": spec.priority,
        "after": list(spec.after),
        "after_any": list(spec.after_any),
        "progress": job.progress,
        "vram_mb": spec.vram_mb,
        "share": spec.share,
        "array_id": spec.array_id,
        "array_index": spec.array_index,
        "array": (
            None
            if spec.array_id is None or spec.array_index is None
            else {"id": spec.array_id, "index": spec.array_index}
        ),
        "max_running": spec.max_running,
        "mem_mb": spec.mem_mb,
        "mem_scale": spec.mem_scale,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "held": job.held,
        "time_limit_s": spec.time_limit_s,
        "cards": None if spec.cards is None else list(spec.cards),
    }
    if attempts is not None:
        out["attempts"] = [cast(AttemptJson, a.to_json()) for a in attempts]
    if events is not None:
        out["events"] = events
        _dropped(out, events)
    return out


def _dropped(out: JobJson, events: list[dict[str, Any]]) -> None:
    """Output the disk refused, from the `output_dropped` events: per attempt, and all."""
    per: dict[int, int] = {}
    for ev in events:
        if ev.get("kind") == "output_dropped":
            n = int(ev.get("attempt") or 0)
            per[n] = per.get(n, 0) + int(ev.get("bytes") or 0)
    out["output_dropped_bytes"] = sum(per.values())
    for attempt in out.get("attempts", []):
        attempt["output_dropped_bytes"] = per.get(attempt["n"], 0)


def _memory(p: Projection | None) -> HostMemory | None:
    if p is None:
        return None
    return {"projected_mb": p.projected_mb, "basis": p.basis, "runs": p.runs, "peak_mb": p.peak_mb}


def public_view(full: JobJson) -> PublicJobJson:
    return {
        "id": full["id"],
        "state": full["state"],
        "owner_uid": full["owner_uid"],
        "gpus": full["gpus"],
        "gpus_requested": full["gpus_requested"],
        "waiting_for": full["waiting_for"],
        "submitted_at": full["submitted_at"],
    }


def stopping(table: Table, job_id: int) -> bool:
    """Running, and the daemon has set out to stop it (cancel, timeout, hang, squeeze):
    signalled, not yet gone. A stopped (SIGSTOP) process shows this until it dies."""
    live = table.live.get(job_id)
    return live is not None and live.kill is not None


def starting(table: Table, job_id: int) -> bool:
    """Running, and its process is not up yet: claimed and being started, or started
    ahead and held by its keeper until the job before it on its card or slot exits."""
    live = table.live.get(job_id)
    return live is not None and live.phase is not Phase.RUNNING
