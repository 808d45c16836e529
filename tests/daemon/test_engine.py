"""The engine's glue around the pure step, on a real store: a submit reads how its
ended parents ended and keeps its request id; a client's command fails fast while the
store cannot write and has a turn to itself; a consistent read waits out a commit in
flight; a turn cancelled under queued commands tells them so. (Turns shared by the
daemon's own commands: test_engine_turns.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from supervisor.core.commands import Cancel, InsertJob, Recover, SaveJob, SubmitJobs
from supervisor.core.draft import Step
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.daemon.broker import Broker
from supervisor.daemon.engine import Engine, TurnLost, submitted_ids
from supervisor.daemon.store.commit import commit
from supervisor.daemon.store.database import StorageError, Store

T0 = "2026-01-02T03:00:00.000Z"


def spec(**kw: Any) -> JobSpec:
    return JobSpec(("true",), "/", {}, 1000, 1000, **kw)


class Gate:
    """Holds the store's commits from now on, each until its turn's event is set (the
    first commit from now on is number 1); `fail[n]` makes commit n raise instead."""

    def __init__(self, store: Store, held: int = 2) -> None:
        self.commits = 0
        self.open = [anyio.Event() for _ in range(held)]
        self.fail: dict[int, Exception] = {}
        real: Callable[[Any], Awaitable[Any]] = store.write

        async def gated(op: Any) -> Any:
            self.commits += 1
            n = self.commits
            if n <= len(self.open):
                await self.open[n - 1].wait()
            if n in self.fail:
                raise self.fail[n]
            return await real(op)

        store.write = gated  # type: ignore[method-assign]

    @property
    def go(self) -> anyio.Event:
        return self.open[0]


async def fresh(store: Store, next_id: int = 1) -> Engine:
    engine = Engine(store, Broker())
    await engine.do(Recover((), {}, frozenset(), {}, next_id))
    return engine


async def test_a_submit_reads_how_its_ended_parents_ended(store: Store) -> None:
    ended = {1: JobState.SUCCEEDED, 2: JobState.FAILED}
    await commit(store, [InsertJob(Job(i, spec(), submitted_at=T0)) for i in ended])
    await commit(store, [SaveJob(Job(i, spec(), s, T0, T0, T0), T0) for i, s in ended.items()])
    engine = await fresh(store, 3)
    [active] = submitted_ids(await engine.do(SubmitJobs((spec(),))))
    assert active == 3
    out = await engine.do(
        SubmitJobs((spec(after=(1,)), spec(after=(2,)), spec(after=(99,)), spec(after=(3,))))
    )
    assert submitted_ids(out) == [4, 5, 6, 7]
    states = {i: j.state for i, j in (await store.get_jobs([4, 5, 6, 7])).items()}
    assert states == {
        4: JobState.QUEUED,  # its parent succeeded
        5: JobState.FAILED,  # its parent failed
        6: JobState.FAILED,  # its parent is nowhere: failed as if it had ended badly
        7: JobState.QUEUED,  # its parent is still active
    }
    five = await store.get_job(5)
    assert five is not None and five.reason is FailureReason.DEPENDENCY_FAILED
    assert sorted(engine.table.jobs) == [3, 4, 7]


async def test_a_submit_keeps_its_request_id_with_its_jobs(store: Store) -> None:
    engine = await fresh(store)
    out = await engine.do(SubmitJobs((spec(), spec()), request_id="req-7"))
    assert submitted_ids(out) == [1, 2]
    assert await store.request_ids(1000, "req-7") == [1, 2]
    # A submit whose parents had ended keeps it too (its command is rebuilt with them).
    await engine.do(Cancel(1))
    out = await engine.do(SubmitJobs((spec(after=(1,)),), request_id="req-8"))
    assert submitted_ids(out) == [3]
    assert await store.request_ids(1000, "req-8") == [3]


async def test_a_client_s_command_fails_fast_while_the_store_cannot_write(store: Store) -> None:
    engine = await fresh(store)
    [queued] = submitted_ids(await engine.do(SubmitJobs((spec(),))))
    store.problem = "state database cannot be written (disk full: test)"
    with store.answering(), pytest.raises(StorageError) as refused:
        await engine.do(SubmitJobs((spec(),)))
    assert (refused.value.reason, refused.value.detail) == (
        "not writable now",
        "state database cannot be written (disk full: test)",
    )
    assert sorted(engine.table.jobs) == [queued]
    # The daemon's own command is not refused: it waits for its commit (which lands here).
    await engine.do(Cancel(queued))
    assert engine.table.jobs == {} and store.problem is None
    with store.answering():  # and a client's, once the store writes again, is taken
        assert submitted_ids(await engine.do(SubmitJobs((spec(),)))) == [2]


async def test_a_client_s_command_has_a_turn_to_itself(store: Store) -> None:
    engine = await fresh(store)
    await engine.do(SubmitJobs((spec(), spec(), spec())))
    gate = Gate(store, held=1)
    outs: dict[int, Step] = {}

    async def cancel(job_id: int, client: bool) -> None:
        if client:
            with store.answering():
                outs[job_id] = await engine.do(Cancel(job_id))
        else:
            outs[job_id] = await engine.do(Cancel(job_id))

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel, 1, False)  # takes the turn; its commit waits at the gate
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(cancel, 2, False)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(cancel, 3, True)
        await anyio.wait_all_tasks_blocked()
        gate.go.set()
    assert gate.commits == 3
    assert outs[2] is not outs[3]
    assert engine.table.jobs == {}


async def test_a_read_is_taken_again_while_a_commit_is_in_flight(store: Store) -> None:
    engine = await fresh(store)
    calls: list[int] = []

    async def reader() -> int:
        calls.append(engine.epoch)
        return len(calls)

    assert engine.epoch == 0
    assert await engine.read(reader) == 1 and calls == [0]
    await engine.do(SubmitJobs((spec(),)))
    assert engine.epoch == 2  # one commit: started, ended
    calls.clear()
    assert await engine.read(reader) == 1 and calls == [2]  # settled: read once
    gate = Gate(store, held=1)
    calls.clear()
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.do, Cancel(1))
        await anyio.wait_all_tasks_blocked()
        assert engine.epoch == 3  # odd: in flight
        assert await engine.read(reader, tries=4) == 4  # never settled: read 4 times
        assert calls == [3, 3, 3, 3]
        calls.clear()
        assert await engine.read(reader) == 5 and len(calls) == 5  # 5 tries by default
        gate.go.set()
    assert engine.epoch == 4


async def test_a_cancelled_turn_tells_the_commands_it_carried(store: Store) -> None:
    engine = await fresh(store)
    await engine.do(SubmitJobs((spec(), spec(), spec())))
    gate = Gate(store)
    errors: dict[int, BaseException] = {}
    scope = anyio.CancelScope()

    async def cancel(job_id: int) -> None:
        try:
            await engine.do(Cancel(job_id))
        except Exception as exc:
            errors[job_id] = exc

    async def takes_the_turn() -> None:
        with scope:
            await engine.do(Cancel(2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel, 1)  # the first turn, held at the gate
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(takes_the_turn)  # queued first: it takes the next turn, for 2 and 3
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(cancel, 3)
        await anyio.wait_all_tasks_blocked()
        gate.open[0].set()
        with anyio.fail_after(30):
            while gate.commits < 2:  # the second turn's commit comes to the gate
                await anyio.sleep(0.01)
        scope.cancel()
    assert scope.cancelled_caught
    assert list(errors) == [3] and isinstance(errors[3], TurnLost)
    assert str(errors[3]) == "the engine's turn was cancelled"


async def test_a_failed_turn_fails_every_command_it_carried(store: Store) -> None:
    engine = await fresh(store)
    await engine.do(SubmitJobs((spec(), spec(), spec())))
    gate = Gate(store)
    gate.fail[2] = RuntimeError("the disk caught fire")
    errors: dict[int, BaseException] = {}

    async def cancel(job_id: int) -> None:
        try:
            await engine.do(Cancel(job_id))
        except Exception as exc:
            errors[job_id] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel, 1)  # the first turn, held at the gate
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(cancel, 2)  # 2 and 3 share the next turn, whose commit fails
        tg.start_soon(cancel, 3)
        await anyio.wait_all_tasks_blocked()
        gate.open[0].set()
        gate.open[1].set()
    assert sorted(errors) == [2, 3]
    assert errors[2] is errors[3]
    assert str(errors[3]) == "the disk caught fire" and isinstance(errors[3], RuntimeError)
    assert sorted(engine.table.jobs) == [2, 3]  # nothing of that turn was applied
