"""`gpusv update`: a queued job's priority, time limit or cards changed in the engine's
turn. The job takes its new place in the queue at once (a new priority reorders it), and
keeps its wait: how long it has been held counts on, and its wait is not announced again.
"""

from __future__ import annotations

import dataclasses

from supervisor.core import pinning
from supervisor.core.commands import SaveSpec, UpdateJob
from supervisor.core.draft import Draft, Verdict
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Event


def update_refusal(job: Job) -> str | None:
    """Why `update` does not apply to this job, or None."""
    if job.state is not JobState.QUEUED:
        return f"is {job.state.value}; only a queued job can be updated"
    return None


def updated_spec(spec: JobSpec, cmd: UpdateJob) -> JobSpec:
    """The spec with the command's values; `cards` () means any card."""
    cards = spec.cards if cmd.cards is None else (cmd.cards or None)
    return dataclasses.replace(
        spec,
        priority=spec.priority if cmd.priority is None else cmd.priority,
        time_limit_s=spec.time_limit_s if cmd.time_limit_s is None else cmd.time_limit_s,
        cards=cards,
    )


def _what_changed(old: JobSpec, new: JobSpec) -> dict[str, object]:
    fields = ("priority", "time_limit_s", "cards")
    return {f: getattr(new, f) for f in fields if getattr(old, f) != getattr(new, f)}


def _words(old: JobSpec, new: JobSpec, changed: dict[str, object]) -> str:
    def shown(spec: JobSpec, field: str) -> str:
        value = getattr(spec, field)
        if field == "cards":
            return "any" if value is None else ",".join(map(str, value))
        if field == "time_limit_s":
            return "none" if value is None else f"{value:g}s"
        return str(value)

    names = {"priority": "priority", "time_limit_s": "time limit", "cards": "cards"}
    return "; ".join(f"{names[f]} {shown(old, f)} -> {shown(new, f)}" for f in changed)


def update_job(d: Draft, cmd: UpdateJob) -> None:
    """Change a queued job's spec; a job not in the table has ended already: no verdict."""
    job = d.job(cmd.job_id)
    if job is None:
        return
    why = update_refusal(job)
    spec = updated_spec(job.spec, cmd)
    why = why or pinning.refusal(spec.gpus, spec.cards)
    if why is not None:
        d.out.verdicts[job.id] = Verdict(False, why)
        return
    changed = _what_changed(job.spec, spec)
    if not changed:
        d.out.verdicts[job.id] = Verdict(True, "unchanged")
        return
    held_since, announced = d.held_since(job.id), d.announced(job.id)
    new = dataclasses.replace(job, spec=spec)
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in changed.items()}
    message = f"{_words(job.spec, spec, changed)} (by uid {cmd.by_uid})"
    d.put(new, Event("updated", message, data))
    d.out.writes.append(SaveSpec(new))
    # Out of the queue and back in under its new key (its priority may have changed);
    # the wait it had goes on.
    d.changes.left.add(job.id)
    if held_since is not None:
        d.changes.held_since[job.id] = held_since
    if announced:
        d.changes.announced.add(job.id)
    d.out.verdicts[job.id] = Verdict(True, "updated")
