"""A listener that raises, on a real SQLite store: the engine's turn is committed and
applied, every other listener and every later action of the step still runs, the caller
hears the committed step (a client is answered with what was made, never an error),
and the next turns go on; a fault in the log lines loses nothing either.
tests/integration/test_listener_fault.py shows the same through a whole daemon."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from structlog.testing import capture_logs

from supervisor.core.admission import Start
from supervisor.core.commands import Changed, Dispatch, Spawn, SubmitJobs, Write
from supervisor.core.jobs import JobSpec, JobState
from supervisor.daemon.broker import Broker
from supervisor.daemon.engine import Engine, submitted_ids
from supervisor.daemon.event_log import JobLines
from supervisor.daemon.store.database import Store

UID = 1000


def spec() -> JobSpec:
    return JobSpec(("true",), "/", {}, UID, UID)


class Faulty(Exception):
    pass


def raises(_event: object) -> None:
    raise Faulty("a listener's bug")


async def test_a_claim_whose_spawn_listener_raises_is_committed_and_published(
    store: Store,
) -> None:
    broker = Broker()
    engine = Engine(store, broker)
    spawned: list[int] = []
    changed: list[tuple[int, JobState]] = []
    broker.subscribe(Spawn, raises)  # first: the ones after it must still run
    broker.subscribe(Spawn, lambda ev: spawned.append(ev.job.id))
    broker.subscribe(Changed, lambda ev: changed.append((ev.new.id, ev.new.state)))
    (job_id,) = submitted_ids(await engine.do(SubmitJobs((spec(),))))
    with capture_logs() as logged:
        out = await engine.do(Dispatch((Start(job_id, (0,), 0),), ()))
    assert [type(a).__name__ for a in out.actions].count("Spawn") == 1
    assert spawned == [job_id]
    assert (job_id, JobState.RUNNING) in changed  # a later action of the same step
    row = await store.get_job(job_id)
    assert row is not None and row.state is JobState.RUNNING
    assert engine.table.jobs[job_id].state is JobState.RUNNING
    assert broker.failures == {"Spawn": 1}
    (failure,) = [e for e in logged if e["event"] == "listener failed"]
    assert failure["event_type"] == "Spawn" and failure["job_id"] == job_id
    assert "raises" in failure["listener"]
    # The engine takes the next turn as usual.
    (second,) = submitted_ids(await engine.do(SubmitJobs((spec(),))))
    assert second == job_id + 1


async def test_a_submit_whose_listener_raises_hears_its_ids(store: Store) -> None:
    broker = Broker()
    broker.subscribe(Changed, raises)
    engine = Engine(store, broker)
    out = await engine.do(SubmitJobs((spec(), spec()), request_id="r-1"))
    ids = submitted_ids(out)
    assert len(ids) == 2
    assert await store.request_ids(UID, "r-1") == ids  # a retry finds these, makes none
    assert broker.failures == {"Changed": 2}


class BrokenLines(JobLines):
    def log(self, writes: Sequence[Write]) -> None:
        raise Faulty("a log line's bug")


async def test_a_fault_in_the_log_lines_loses_nothing_committed(store: Store) -> None:
    broker = Broker()
    seen: list[int] = []
    broker.subscribe(Changed, lambda ev: seen.append(ev.new.id))
    engine = Engine(store, broker, lines=BrokenLines())
    with capture_logs() as logged:
        ids = submitted_ids(await engine.do(SubmitJobs((spec(),))))
    assert seen == ids and set(ids) <= set(engine.table.jobs)
    assert any(e["event"] == "job lines not logged" for e in logged)


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
async def test_what_is_not_an_exception_is_not_swallowed(
    store: Store, kind: type[BaseException]
) -> None:
    """Only a listener's faults are isolated, not a request to stop the process."""
    broker = Broker()

    def stop(_event: object) -> None:
        raise kind()

    broker.subscribe(Changed, stop)
    with pytest.raises(kind):
        await Engine(store, broker).do(SubmitJobs((spec(),)))
