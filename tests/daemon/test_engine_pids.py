"""A started attempt's pid, on a real store: the engine holds it back (its keeper's
journal has it), a short job's end records it with the end, in no statement of its own,
and a reader that must see it gets it from the store's settle."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from supervisor.core.admission import Start
from supervisor.core.commands import Dispatch, Ended, Recover, Spawning, Started, SubmitJobs
from supervisor.core.jobs import ExitStatus, JobSpec
from supervisor.core.outcome import Facts
from supervisor.daemon.broker import Broker
from supervisor.daemon.engine import Engine
from supervisor.daemon.store.database import Store


class Statements:
    """The statements the store's connection runs while traced (on its own thread)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.seen: list[str] = []

    async def trace(self, on: bool) -> None:
        conn = self.store.db._conn
        on_thread: Callable[..., Awaitable[Any]] = self.store.db._execute
        await on_thread(conn.set_trace_callback, self.seen.append if on else None)

    def updates(self, table: str) -> list[str]:
        return [s for s in self.seen if s.startswith(f"UPDATE {table} ")]


async def started(store: Store) -> Engine:
    """An engine with job 1 running as attempt 1, pid 4242."""
    engine = Engine(store, Broker())
    await engine.do(Recover((), {}, frozenset(), {}, 1))
    await engine.do(SubmitJobs((JobSpec(("true",), "/", {}, 1000, 1000),)))
    await engine.do(Dispatch((Start(1, (0,), 0),), ()))
    await engine.do(Spawning(1, 1))
    await engine.do(Started(1, 1, 4242, 17.25))
    return engine


def attempt_row(path: Path) -> tuple[Any, ...]:
    with sqlite3.connect(path) as db:
        return tuple(db.execute("SELECT pid, pid_start, ended_at FROM attempts").fetchone())


async def test_a_short_job_s_end_records_its_pid(store: Store, tmp_path: Path) -> None:
    engine = await started(store)
    seen = Statements(store)
    await seen.trace(True)
    await engine.do(Ended(1, 1, Facts(ExitStatus(0, None))))
    await seen.trace(False)
    pid, pid_start, ended_at = attempt_row(tmp_path / "gpusv.db")
    assert (pid, pid_start) == (4242, 17.25) and ended_at is not None
    assert len(seen.updates("attempts")) == 1 and len(seen.updates("jobs")) == 1
    engine.release_pids()  # nothing is left held to land after the end
    await store.settle()
    assert attempt_row(tmp_path / "gpusv.db")[0] == 4242


async def test_a_held_pid_is_recorded_when_a_reader_settles(store: Store, tmp_path: Path) -> None:
    await started(store)
    assert attempt_row(tmp_path / "gpusv.db")[0] is None  # held: the keeper's journal has it
    await store.settle()
    assert attempt_row(tmp_path / "gpusv.db")[:2] == (4242, 17.25)
