"""Start-up reconciliation: what an earlier incarnation left running becomes `interrupted`.

A daemon killed at any instant restarts here: the shell gathers the facts (the active
jobs, their open attempts, leftover processes killed by pid and start time, the ends of
--after parents) and the engine's Recover command decides: queued jobs stay queued;
every attempt that has no end is closed as `interrupted` (charged to no budget) and its
job is queued again.
"""

from __future__ import annotations

import dataclasses

import anyio
import structlog

from supervisor.core.commands import Recover
from supervisor.core.jobs import FailureReason, JobState
from supervisor.daemon.clock import now_iso
from supervisor.daemon.commit import next_job_id
from supervisor.daemon.engine import Engine
from supervisor.daemon.membook import MemoryBook
from supervisor.daemon.runner import kill_leftover
from supervisor.daemon.store import Store

log = structlog.get_logger("gpusvd.recovery")


async def reconcile(engine: Engine, store: Store, book: MemoryBook) -> None:
    open_attempts = {a.job_id: a for a in await store.open_attempts()}
    jobs = await store.active_jobs()
    active = {job.id for job in jobs}
    killed: set[int] = set()
    for job in jobs:
        await book.load(job.spec.mem_key)
        attempt = open_attempts.get(job.id)
        if job.state is JobState.RUNNING and attempt is not None and attempt.pid:
            pid, start = attempt.pid, attempt.pid_start
            if await anyio.to_thread.run_sync(kill_leftover, pid, start):
                killed.add(job.id)
            log.warning("attempt interrupted by restart", job_id=job.id, killed=job.id in killed)
    ended: dict[int, JobState] = {}
    for job in jobs:
        for parent in job.spec.after:
            if parent not in active and parent not in ended:
                row = await store.get_job(parent)
                ended[parent] = row.state if row is not None else JobState.FAILED
    mine = {i: a for i, a in open_attempts.items() if i in active}
    await engine.do(Recover(tuple(jobs), mine, frozenset(killed), ended, await next_job_id(store)))
    for attempt in open_attempts.values():  # an attempt whose job is no longer active
        if attempt.job_id in active:
            continue
        closed = dataclasses.replace(
            attempt, ended_at=now_iso(), reason=FailureReason.INTERRUPTED.value
        )
        job_row = await store.get_job(attempt.job_id)
        if job_row is not None:
            await store.save(job_row, now_iso(), None, ended_attempt=closed)
    if jobs:
        log.info("reconciled", active=len(jobs))
