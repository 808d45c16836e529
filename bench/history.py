"""A state directory with N finished jobs, written through the Store API before a daemon
starts on it: the rows are those the daemon writes for a `true` that succeeded (the job,
one ended attempt, the submitted/started/exited events), in a fraction of the time that
running N jobs would take."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio

from supervisor.core.jobs import Job, JobSpec, JobState, transition
from supervisor.core.memkey import mem_key
from supervisor.daemon.clock import now_iso
from supervisor.daemon.store.database import Attempt, Event, Store

CHUNK = 10_000


async def _finish(store: Store, job: Job, at: str) -> None:
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
    await store.save(done, at, events, new_attempt=attempt)


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
            for start in range(0, jobs, CHUNK):
                at = now_iso()
                ids = await store.insert_jobs([spec] * min(CHUNK, jobs - start), at)
                async with anyio.create_task_group() as saves:  # one group commit
                    for job_id in ids:
                        saves.start_soon(_finish, store, Job(id=job_id, spec=spec), at)
            tg.cancel_scope.cancel()
    finally:
        await store.close()


def write_history(state_dir: Path, jobs: int) -> float:
    """Write `jobs` finished jobs into a new state dir; returns the seconds it took."""
    began = time.perf_counter()
    anyio.run(_write, state_dir, jobs)
    return time.perf_counter() - began
