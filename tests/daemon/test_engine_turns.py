"""The engine's turns, on a real SQLite store: the daemon's own commands that arrive
while a commit is in flight are taken together in the next turn (one transaction), each
caller hears its turn's step, the actions come in the commands' order, and a command
whose caller gave up before its turn is never taken."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from supervisor.core.commands import Cancel, Changed, InsertJob, SaveJob, SubmitJobs, Write
from supervisor.core.draft import Step
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.daemon.broker import Broker
from supervisor.daemon.engine import Engine
from supervisor.daemon.store.database import Store


def job_of(w: Write) -> Job:
    """The job a write saves; a write of any other kind fails the test."""
    assert isinstance(w, InsertJob | SaveJob), w
    return w.job


class Turns:
    """An engine with four queued jobs. Its first commit from now on waits for `go`; it
    counts its commits and the jobs its Changed actions name, in order."""

    def __init__(self, store: Store) -> None:
        self.broker = Broker()
        self.engine = Engine(store, self.broker)
        self.store = store
        self.changed: list[int] = []
        self.commits = 0
        self.go = anyio.Event()

    async def setup(self) -> None:
        await self.engine.do(SubmitJobs(tuple(JobSpec(("true",), "/", {}, 0, 0) for _ in range(4))))
        self.broker.subscribe(Changed, lambda ev: self.changed.append(ev.new.id))
        real: Callable[[Any], Awaitable[Any]] = self.store.write

        async def gated(op: Any) -> Any:
            self.commits += 1
            if self.commits == 1:
                await self.go.wait()
            return await real(op)

        self.store.write = gated  # type: ignore[method-assign]

    def state(self, job_id: int) -> JobState | None:
        job = self.engine.table.jobs.get(job_id)
        return job.state if job else None


async def test_commands_that_queue_behind_a_commit_share_the_next_turn(store: Store) -> None:
    t = Turns(store)
    await t.setup()
    outs: dict[int, Step] = {}

    async def cancel(job_id: int) -> None:
        outs[job_id] = await t.engine.do(Cancel(job_id))

    async with anyio.create_task_group() as tg:
        for job_id in (1, 2, 3, 4):  # 1 takes the turn; 2, 3, 4 queue behind its commit
            tg.start_soon(cancel, job_id)
        await anyio.wait_all_tasks_blocked()
        assert t.changed == [] and t.commits == 1  # nothing acted on before it lands
        t.go.set()
    assert t.commits == 2
    assert t.changed == [1, 2, 3, 4]
    assert outs[2] is outs[3] is outs[4] and outs[1] is not outs[2]
    assert [job_of(w).id for w in outs[2].writes] == [2, 3, 4]
    assert all(t.state(j) is None for j in (1, 2, 3, 4))  # cancelled: no longer active


async def test_a_command_given_up_before_its_turn_is_never_taken(store: Store) -> None:
    t = Turns(store)
    await t.setup()
    gave_up = anyio.CancelScope()

    async def gives_up() -> None:
        with gave_up:
            await t.engine.do(Cancel(2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(t.engine.do, Cancel(1))
        tg.start_soon(gives_up)
        tg.start_soon(t.engine.do, Cancel(3))
        await anyio.wait_all_tasks_blocked()
        gave_up.cancel()  # it waits for the turn that 1's commit holds
        await anyio.wait_all_tasks_blocked()
        t.go.set()
    assert t.changed == [1, 3] and t.commits == 2
    assert t.state(2) is JobState.QUEUED
