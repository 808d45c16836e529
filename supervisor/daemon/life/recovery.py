"""Start-up reconciliation: running jobs are taken back from their keepers; what cannot be
taken back becomes `interrupted`.

A daemon killed at any instant restarts here: the shell gathers the facts (the active
jobs, their open attempts, what every keeper holds, the ends of --after parents) and the
engine's Recover command decides: queued jobs stay queued; an attempt a keeper still
holds stays running (its end, even one that came while no daemon ran, arrives as for any
attempt); every other attempt without an end is closed as `interrupted` (charged to no
budget) and its job is queued again.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import structlog

from supervisor.core.commands import Recover
from supervisor.core.dependencies import parents
from supervisor.core.jobs import JobState
from supervisor.daemon.engine import Engine
from supervisor.daemon.running.handles import KeptProcess
from supervisor.daemon.running.keepers import KeeperGone, Keepers
from supervisor.daemon.running.launch import kill_leftover
from supervisor.daemon.store.commit import next_job_id
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.keeper.client import KeeperError
from supervisor.keeper.journal import Key

if TYPE_CHECKING:
    from supervisor.daemon.running.runner import Runner

log = structlog.get_logger("gpusvd.recovery")


async def reconcile(
    engine: Engine,
    store: Store,
    book: MemoryBook,
    keepers: Keepers | None = None,
    runner: Runner | None = None,
) -> None:
    open_attempts = {a.job_id: a for a in await store.open_attempts()}
    jobs = await store.active_jobs()
    active = {job.id for job in jobs}
    # Every keeper is attached (and an earlier daemon's connection fenced off) before
    # anything is decided: a start in flight then either shows here or never happens.
    kept = await keepers.ensure_all() if keepers is not None else {}
    adopted: dict[int, KeptProcess] = {}
    killed: set[int] = set()
    never_started: set[int] = set()
    for job in jobs:
        await book.load(job.spec.mem_key)
        attempt = open_attempts.get(job.id)
        if job.state is not JobState.RUNNING or attempt is None:
            continue
        proc = kept.get((job.id, attempt.n))
        if proc is not None and not proc.record.lost:
            adopted[job.id] = kept.pop((job.id, attempt.n))
            log.info("attempt taken back", job_id=job.id, attempt=attempt.n, pid=proc.pid)
            continue
        if proc is None and attempt.pid is None:
            # No pid stored, no keeper's record: its keeper never started it (the record
            # is written before the command may run). The claim is released.
            never_started.add(job.id)
            log.info("claim released: it never started", job_id=job.id, attempt=attempt.n)
            continue
        # Started before keepers, or its record is gone: by pid and start time, as before.
        if proc is None and attempt.pid:
            pid: int = attempt.pid
            if await anyio.to_thread.run_sync(kill_leftover, pid, attempt.pid_start):
                killed.add(job.id)
        log.warning("attempt interrupted by restart", job_id=job.id, killed=job.id in killed)
    ended: dict[int, JobState] = {}
    for job in jobs:
        for parent in parents(job.spec):
            if parent not in active and parent not in ended:
                row = await store.get_job(parent)
                ended[parent] = row.state if row is not None else JobState.FAILED
    mine = {i: a for i, a in open_attempts.items() if i in active}
    next_id = await next_job_id(store)
    specs = {job.id: job.spec for job in jobs if job.id in adopted}
    found = Recover(
        tuple(jobs),
        mine,
        frozenset(killed),
        ended,
        next_id,
        {i: (proc.pid, proc.start_time) for i, proc in adopted.items()},
        {i: book.projection(spec) for i, spec in specs.items()},  # it counts as it did
        {i: book.vram_need(spec) or 0 for i, spec in specs.items()},
        tuple(a for a in open_attempts.values() if a.job_id not in active),
        frozenset(never_started),
    )
    await engine.do(found)
    for job_id, proc in adopted.items():
        live = engine.table.live[job_id]
        assert runner is not None
        runner.adopt(job_id, live.attempt.n, live.cards, live.seq, proc)
    await _forget_the_rest(kept)
    if jobs:
        log.info("reconciled", active=len(jobs))


async def _forget_the_rest(kept: dict[Key, KeptProcess]) -> None:
    """Records no open attempt wants: ends already committed (a daemon that died between
    its commit and its ack), lost attempts now recorded `interrupted`. Whatever of them
    still runs is killed first: nothing runs outside an open attempt."""
    for proc in kept.values():
        with contextlib.suppress(KeeperError, KeeperGone):
            if not proc.record.ended:
                await proc.kill(0.0)
                await proc.wait()
            await proc.ack()
