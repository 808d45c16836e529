"""A group commit's writes run without a savepoint each while they all succeed; when one
fails for its own statement, the batch is run again, each write in a savepoint, and the
others commit with their results as if it had never been tried."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite
import pytest

from supervisor.daemon.store.writer import Writer

from .batching import batch, committed


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[Writer, Path, list[str]]]:
    path = tmp_path / "t.db"
    db = await aiosqlite.connect(path, isolation_level=None)
    await db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    statements: list[str] = []
    await db.set_trace_callback(statements.append)
    try:
        yield Writer(db), path, statements
    finally:
        await db.close()


async def test_a_batch_that_succeeds_takes_no_savepoints(
    traced: tuple[Writer, Path, list[str]],
) -> None:
    w, path, statements = traced

    def insert(key: str) -> object:
        def op(db: sqlite3.Connection) -> str:
            db.execute("INSERT INTO t VALUES (?)", (key,))
            return key

        return op

    results = await batch(w, {k: insert(k) for k in ("a", "b", "c")})
    assert results == {"lead": "lead", "a": "a", "b": "b", "c": "c"}
    assert committed(path) == ["a", "b", "c", "l0"]
    assert statements.count("COMMIT") == 2  # the lead's, and one for the three
    assert not [s for s in statements if "SAVEPOINT" in s.upper()]


async def test_a_failing_last_write_leaves_the_others_committed_once(
    traced: tuple[Writer, Path, list[str]],
) -> None:
    w, path, statements = traced
    runs: list[str] = []

    def first(db: sqlite3.Connection) -> str:
        runs.append("first")
        db.execute("INSERT INTO t VALUES ('a')")
        return "first"

    def second(db: sqlite3.Connection) -> str:
        runs.append("second")
        inside = [k for (k,) in db.execute("SELECT k FROM t ORDER BY k")]
        db.execute("INSERT INTO t VALUES ('b')")
        return ",".join(inside)

    def bad(db: sqlite3.Connection) -> str:
        db.execute("INSERT INTO t VALUES ('x')")  # undone with its write
        db.execute("INSERT INTO t VALUES ('a')")  # a constraint: the op fails
        return "unreachable"

    results = await batch(w, {"first": first, "second": second, "bad": bad})
    assert results["first"] == "first"
    assert results["second"] == "a,l0"  # as it saw the batch the second time, committed
    assert isinstance(results["bad"], sqlite3.IntegrityError)
    assert committed(path) == ["a", "b", "l0"]
    assert runs == ["first", "second", "first", "second"]  # rolled back, then in savepoints
    assert statements.count("COMMIT") == 2
    assert w.problem is None and w.failures == 0
