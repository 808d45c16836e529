"""The end of an attempt: one pure function from what is known about it to what follows.

The facts are gathered by the shell (the exit status, why the daemon killed it, hang and
OOM evidence, a spawn error); the budgets are the job's. Retry policy itself is retry.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.core import retry
from supervisor.core.evolve import evolve
from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobState, classify_exit, transition
from supervisor.core.records import Attempt, Event, iso_at


@dataclass(frozen=True)
class Facts:
    """What happened to one attempt; no decision in here."""

    status: ExitStatus | None  # None: no process ran (a spawn error, or stopped before)
    killed_for: FailureReason | None = None  # why the daemon killed it, if it did
    kill_evidence: dict[str, Any] | None = None
    hang: dict[str, Any] | None = None  # a reset or hang of its card, near its end
    oom: str | None = None  # where OOM-kill evidence came from
    spawn_error: str | None = None
    spawn_transient: bool = False  # the spawn error may pass: retried (spawn_retry)
    spawn_kind: str | None = None  # what kind of start failure, where known: "cgroup"
    peak_rss_mb: int | None = None
    peak_vram_mb: int | None = None  # the most VRAM its processes held, where the backend tells
    machine: dict[str, Any] | None = None  # readings for a hang record, taken when seen
    exited_at: float | None = None  # epoch s its keeper reaped it: the attempt's end
    output_dropped: int = 0  # bytes of its output its keeper could not write (a full disk)


@dataclass(frozen=True)
class Outcome:
    job: Job  # the job after the attempt: queued again, or terminal
    attempt: Attempt  # the attempt, closed
    events: tuple[Event, ...]


def failure(f: Facts) -> tuple[FailureReason | None, dict[str, Any] | None]:
    """Why the attempt failed (None: it succeeded) and the evidence for it.

    A kill by the daemon names its own reason (a cancel, a hang, the squeeze guard, a
    drain); a success stands whatever the log said; a hang outranks any other failure."""
    if f.killed_for is FailureReason.CANCELLED:
        return FailureReason.CANCELLED, None
    if f.status is None:
        if f.spawn_error is not None:
            said: dict[str, Any] = {"message": f.spawn_error}
            if f.spawn_kind is not None:
                said["kind"] = f.spawn_kind
            if f.spawn_transient:
                return FailureReason.SPAWN_RETRY, said
            return FailureReason.SPAWN_FAILED, said
        return f.killed_for or FailureReason.INTERRUPTED, f.kill_evidence
    if f.killed_for is not None:
        return f.killed_for, f.kill_evidence
    if classify_exit(f.status) is None:
        return None, None
    reason = classify_exit(f.status, oom_evidence=f.oom is not None, hang_evidence=bool(f.hang))
    if reason is FailureReason.GPU_HANG:
        return reason, f.hang
    if reason is FailureReason.OOM_KILLED:
        return reason, {"source": f.oom}
    return reason, None


def keeper_lost(evidence: dict[str, Any] | None) -> bool:
    """Whether an interruption's evidence says the job's keeper died under it (it then
    costs the job an attempt of its ordinary budget: retry.budget_for)."""
    return bool(evidence and evidence.get("keeper"))


def keeper_death(name: str, pid: int) -> dict[str, Any]:
    """The evidence of an attempt whose keeper died while it ran: the keeper named."""
    message = f"keeper {name} died" + (f" (pid {pid})" if pid > 0 else "")
    return {"message": message, "keeper": name, "keeper_pid": pid}


def _message(reason: FailureReason, f: Facts) -> str:
    if f.spawn_error:
        return f.spawn_error
    if reason is FailureReason.INTERRUPTED and keeper_lost(f.kill_evidence):
        return str((f.kill_evidence or {})["message"])
    limit = (f.kill_evidence or {}).get("limit_s") if reason is FailureReason.TIMEOUT else None
    if limit:
        return f"past its wall-time limit of {limit:g}s"
    if f.status is None:
        return reason.value
    if f.status.exit_code is not None:
        return f"exit code {f.status.exit_code}"
    return f"killed by signal {f.status.signal}"


def end_of_attempt(job: Job, attempt: Attempt, f: Facts, at: str, now_wall: float) -> Outcome:
    """The job and attempt after the attempt ended, with the events that say so."""
    reason, evidence = failure(f)
    code = f.status.shell_code if f.status else None
    if f.exited_at is not None:  # when it ended, not when that was recorded here
        at = max(iso_at(f.exited_at), attempt.started_at)
    closed = evolve(
        attempt,
        ended_at=at,
        exit_code=f.status.exit_code if f.status else None,
        signal=f.status.signal if f.status else None,
        reason=reason.value if reason else None,
        peak_rss_mb=f.peak_rss_mb or None,
        peak_vram_mb=f.peak_vram_mb or None,
        evidence=evidence,
    )
    said = _dropped(attempt.n, f.output_dropped)
    if reason is None:
        done = transition(job, JobState.SUCCEEDED, at, None, exit_code=0)
        return Outcome(done, closed, (*said, Event("exited", "exited 0", {"exit_code": 0})))
    events = [
        *said,
        Event("exited", f"{reason.value}: {_message(reason, f)}", {"reason": reason.value}),
    ]
    if reason is FailureReason.GPU_HANG:
        events.insert(0, Event("gpu_hang", "attempt failed as gpu_hang"))
    if reason is FailureReason.CANCELLED:
        events.append(Event("cancelled", "cancelled while running"))
        return Outcome(
            transition(job, JobState.CANCELLED, at, reason, exit_code=code), closed, (*events,)
        )
    action = retry.next_action(
        reason,
        ordinary_used=job.ordinary_used,
        ordinary_budget=job.spec.retries,
        gpu_hang_used=job.gpu_hang_used,
        gpu_hang_budget=job.spec.gpu_hang_retries,
        charged=reason is FailureReason.INTERRUPTED and keeper_lost(evidence),
    )
    if isinstance(action, retry.Fail):
        if reason is FailureReason.SPAWN_RETRY:  # tried as often as it may: for good now
            reason = FailureReason.SPAWN_FAILED
        failed = transition(job, JobState.FAILED, at, reason, exit_code=code)
        return Outcome(failed, closed, (*events,))
    if action.charge is None:
        events.append(Event("interrupted", "interrupted by a daemon stop; requeued"))
        return Outcome(transition(job, JobState.QUEUED, at, reason), closed, (*events,))
    queued = transition(
        job,
        JobState.QUEUED,
        at,
        reason,
        not_before=now_wall + action.delay_s,
        ordinary_used=job.ordinary_used + (action.charge == "ordinary"),
        gpu_hang_used=job.gpu_hang_used + (action.charge == "gpu_hang"),
    )
    events.append(
        Event(
            "retry_scheduled",
            f"retry in {action.delay_s:.0f}s ({action.charge} budget)",
            {"budget": action.charge, "delay_s": action.delay_s},
        )
    )
    return Outcome(queued, closed, (*events,))


def _dropped(n: int, dropped: int) -> tuple[Event, ...]:
    """Output the job wrote that no file took (a full disk): said, and counted."""
    if dropped <= 0:
        return ()
    message = f"{dropped} bytes of output dropped: the disk refused them (the job ran on)"
    return (Event("output_dropped", message, {"bytes": dropped, "attempt": n}),)


def reclassified(job: Job, attempt: Attempt, evidence: dict[str, Any]) -> Outcome | None:
    """A reset line for the attempt's card that came after its end: if the job is queued
    for the retry of that very attempt, the retry moves from the ordinary to the hang
    budget and the attempt becomes a hang. None when it is too late to say so."""
    if job.state is not JobState.QUEUED or job.attempts != attempt.n:
        return None
    if job.reason is FailureReason.GPU_HANG:  # said so already
        return None
    if attempt.reason not in (FailureReason.EXIT_NONZERO.value, FailureReason.SIGNAL.value):
        return None
    fixed = evolve(
        job,
        reason=FailureReason.GPU_HANG,
        ordinary_used=max(0, job.ordinary_used - 1),
        gpu_hang_used=job.gpu_hang_used + 1,
    )
    closed = evolve(attempt, reason=FailureReason.GPU_HANG.value, evidence=evidence)
    message = f"attempt {attempt.n} reclassified as gpu_hang: a reset line for its GPU followed"
    return Outcome(fixed, closed, (Event("gpu_hang", message),))
