"""The engine's step for start-up (`Recover`): what the daemon found of every active job
after a restart, turned into the table and the writes that make the record true. A job a
keeper still holds runs on; a stop committed before the restart goes on; a claim that
never started is released; whatever else ran is queued again as `interrupted`."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from supervisor.core.commands import (
    Changed,
    CloseAttempt,
    DropAttempt,
    Kill,
    Now,
    Recover,
    SaveJob,
    SetPid,
)
from supervisor.core.dependencies import parents
from supervisor.core.draft import Draft
from supervisor.core.jobs import FailureReason, Job, JobState, transition
from supervisor.core.outcome import Facts
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt, Event, epoch_of
from supervisor.core.table import Live, Phase


def recover(d: Draft, cmd: Recover) -> None:
    """Start-up: queued jobs stay queued; a job that was running when the daemon stopped
    is queued again as `interrupted` (charged to no budget), its attempt closed."""
    d.changes.next_id = max(cmd.next_id, d.changes.next_id or d.table.next_id)
    for job in cmd.jobs:
        attempt = cmd.open_attempts.get(job.id)
        if job.state is JobState.RUNNING and attempt is not None and job.id in cmd.adopted:
            _adopt(d, job, attempt, cmd)
            continue
        if job.state is JobState.RUNNING and attempt is not None and attempt.stop_reason:
            _stopped_meanwhile(d, job, attempt)
            continue
        if job.state is JobState.RUNNING and attempt is not None and job.id in cmd.never_started:
            job = _unclaimed(d, job, attempt)
        elif job.state is JobState.RUNNING:
            message = "the daemon stopped while this attempt ran" + (
                "; its leftover processes were killed" if job.id in cmd.killed else ""
            )
            requeued = transition(job, JobState.QUEUED, d.now.iso, FailureReason.INTERRUPTED)
            end = None
            if attempt is not None:
                reason = FailureReason.INTERRUPTED.value
                end = dataclasses.replace(attempt, ended_at=d.now.iso, reason=reason)
            d.set_job(requeued)
            d.out.writes.append(
                SaveJob(requeued, d.now.iso, (Event("interrupted", message),), None, end)
            )
            job = requeued
        d.set_job(job)
        d.out.actions.append(Changed(None, job))
        if job.hold_reason:  # announced before the restart: not evented again
            d.changes.announced.add(job.id)
        if parents(job.spec):
            d.changes.pending[job.id] = frozenset()
    for job in cmd.jobs:
        if parents(job.spec):
            d.track(d.job(job.id) or job, cmd.ended_parents)
    reason = FailureReason.INTERRUPTED.value
    for orphan in cmd.orphans:
        d.out.writes.append(CloseAttempt(replace(orphan, ended_at=d.now.iso, reason=reason)))


def _stopped_meanwhile(d: Draft, job: Job, attempt: Attempt) -> None:
    """A stop was committed, and its process is gone with its keeper: the stop's reason
    decides the end (a cancel ends `cancelled` and runs nothing again), not the restart."""
    reason = FailureReason(attempt.stop_reason or FailureReason.INTERRUPTED.value)
    d.set_job(job)
    live = _live(d, attempt, Phase.RUNNING, projection=None, vram_reserved_mb=0)
    d.end(job, live, Facts(status=None, killed_for=reason, kill_evidence=attempt.stop_evidence))


def _unclaimed(d: Draft, job: Job, attempt: Attempt) -> Job:
    """Claimed, never started: the claim is released as if it had not been made. No
    attempt row says it ran, nothing is charged, and the event says what happened."""
    first = attempt.n == 1  # then the job never started at all
    requeued = transition(
        job,
        JobState.QUEUED,
        d.now.iso,
        job.reason,
        attempts=attempt.n - 1,
        gpus=() if first else job.gpus,
        started_at=None if first else job.started_at,
    )
    d.set_job(requeued)
    d.out.writes.append(DropAttempt(attempt.job_id, attempt.n))
    message = "claimed, but the daemon stopped before it started: queued again"
    d.out.writes.append(SaveJob(requeued, d.now.iso, (Event("requeued", message),)))
    return requeued


def _live(
    d: Draft,
    attempt: Attempt,
    phase: Phase,
    *,
    projection: Projection | None,
    vram_reserved_mb: int,
) -> Live:
    """A live attempt taken back at start-up, next in dispatch order; a stop committed
    before the restart comes with it."""
    seq = (d.changes.seq if d.changes.seq is not None else d.table.seq) + 1
    d.changes.seq = seq
    reason = FailureReason(attempt.stop_reason) if attempt.stop_reason else None
    return Live(
        attempt=attempt,
        cards=tuple(attempt.gpus),
        seq=seq,
        phase=phase,
        projection=projection,
        vram_reserved_mb=vram_reserved_mb,
        claimed_mono=d.now.mono,
        kill=reason,
        evidence=attempt.stop_evidence,
        kill_since=epoch_of(attempt.stop_at) if attempt.stop_at else None,
    )


def _adopt(d: Draft, job: Job, attempt: Attempt, cmd: Recover) -> None:
    """A job whose keeper still holds its attempt: running as stored, its cards taken.
    The pid comes from the keeper's record: a daemon killed before it committed the
    start left none in the store."""
    pid, pid_start = cmd.adopted[job.id]
    if (attempt.pid, attempt.pid_start) != (pid, pid_start):
        # The start was never committed here, so neither was its moment: the claim's
        # stands in the store, earlier by as long as a job claimed ahead waited.
        started = attempt.started_at if pid_start is None else Now(pid_start, 0.0).iso
        job_started_at = None
        if job.started_at == attempt.started_at and started != job.started_at:
            job_started_at = started
            job = dataclasses.replace(job, started_at=started)
        attempt = dataclasses.replace(attempt, pid=pid, pid_start=pid_start, started_at=started)
        d.out.writes.append(SetPid(attempt, job_started_at))
    d.set_job(job)
    live = d.changes.live[job.id] = _live(
        d,
        attempt,
        Phase.RUNNING,
        projection=cmd.projections.get(job.id),
        vram_reserved_mb=cmd.vram_reserved.get(job.id, 0),
    )
    d.out.actions.append(Changed(None, job))
    if live.kill is not None:  # stopped before the restart: the stop goes on
        d.out.actions.append(Kill(job.id, None, live.kill_since))
