"""Start-up reconciliation: what an earlier incarnation left running becomes `interrupted`.

A daemon killed at any instant restarts here: queued jobs stay queued; every attempt
that has no end is closed as `interrupted` (charged to no budget), a leftover process of
it (same pid and start time) is killed first, and its job is queued again.
"""

from __future__ import annotations

import dataclasses

import anyio
import structlog

from supervisor.core.jobs import FailureReason, JobState, transition
from supervisor.daemon.clock import now_iso
from supervisor.daemon.runner import kill_leftover
from supervisor.daemon.scheduler import Scheduler
from supervisor.daemon.store import Event, Store

log = structlog.get_logger("gpusvd.recovery")


async def reconcile(sched: Scheduler, store: Store) -> None:
    open_attempts = {a.job_id: a for a in await store.open_attempts()}
    jobs = await store.active_jobs()
    for job in jobs:
        await sched.load_history(job.spec.mem_key)
        attempt = open_attempts.pop(job.id, None)
        if job.state is JobState.RUNNING:
            killed = False
            if attempt is not None and attempt.pid:
                pid, start = attempt.pid, attempt.pid_start
                killed = await anyio.to_thread.run_sync(kill_leftover, pid, start)
            at = now_iso()
            message = "the daemon stopped while this attempt ran" + (
                "; its leftover processes were killed" if killed else ""
            )
            requeued = transition(job, JobState.QUEUED, at, FailureReason.INTERRUPTED)
            ended = (
                dataclasses.replace(attempt, ended_at=at, reason=FailureReason.INTERRUPTED.value)
                if attempt is not None
                else None
            )
            await store.save(requeued, at, Event("interrupted", message), ended_attempt=ended)
            log.warning("attempt interrupted by restart", job_id=job.id, killed=killed)
            job = requeued
        sched.put(job)
        if job.state is JobState.QUEUED and job.hold_reason:
            # Announced before the restart: the same wait must not be evented again.
            sched.announced[job.id] = {job.hold_reason}
    for job in jobs:
        if sched.jobs.get(job.id) is not None and job.spec.after:
            await sched._track_deps(sched.jobs[job.id])
    for attempt in open_attempts.values():  # an attempt whose job is no longer active
        ended = dataclasses.replace(
            attempt, ended_at=now_iso(), reason=FailureReason.INTERRUPTED.value
        )
        job_row = await store.get_job(attempt.job_id)
        if job_row is not None:
            await store.save(job_row, now_iso(), None, ended_attempt=ended)
    if jobs:
        log.info("reconciled", active=len(jobs))
