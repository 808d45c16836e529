"""A state directory with N finished jobs, written through the engine's commit before a daemon
starts on it: the rows are those the daemon writes for a `true` that succeeded (the job,
one ended attempt, the submitted/started/exited events), in a fraction of the time that
running N jobs would take."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio

from supervisor.core.commands import InsertJob, SaveJob
from supervisor.core.jobs import Job, JobSpec, JobState, transition
from supervisor.core.memkey import mem_key
from supervisor.core.records import Attempt, Event
from supervisor.daemon.clock import now_iso
from supervisor.daemon.store.commit import commit, next_job_id
from supervisor.daemon.store.database import Store

CHUNK = 10_000


def _finished(job: Job, at: str) -> SaveJob:
    attempt = Attempt(
        job_id=job.id,
        n=1,
        gpus=(0,),
        started_at=at,
        mem_key=job.spec.mem_key,
        pid=1,
        pid_start=0.0,
        ended_at=at,
        exit_code=0,
    )
    running = transition(job, JobState.RUNNING, at, gpus=(0,), attempts=1)
    done = transition(running, JobState.SUCCEEDED, at, None, exit_code=0)
    events = [Event("started", "attempt 1 on GPUs 0", {"gpus": [0]}), Event("exited", "exited 0")]
    return SaveJob(done, at, tuple(events), new_attempt=attempt)


async def _write(state_dir: Path, jobs: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    store = await Store.open(state_dir / "state.db")
    spec = JobSpec(
        argv=("true",),
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        owner_uid=os.geteuid(),
        owner_gid=os.getegid(),
        mem_key=mem_key(("true",)),
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(store.run_writer)
            next_id = await next_job_id(store)
            for start in range(0, jobs, CHUNK):
                at = now_iso()
                count = min(CHUNK, jobs - start)
                batch = [Job(id=next_id + i, spec=spec, submitted_at=at) for i in range(count)]
                next_id += count
                await commit(store, [InsertJob(job) for job in batch])
                await commit(store, [_finished(job, at) for job in batch])
            tg.cancel_scope.cancel()
    finally:
        await store.close()


def write_history(state_dir: Path, jobs: int) -> float:
    """Write `jobs` finished jobs into a new state dir; returns the seconds it took."""
    began = time.perf_counter()
    anyio.run(_write, state_dir, jobs)
    return time.perf_counter() - began
