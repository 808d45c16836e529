"""The group commit's isolation: writes that queue while a commit is in flight share the
next transaction, and one whose own statement fails is undone alone (its savepoint), on a
real SQLite file."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiosqlite
import anyio
import pytest

from supervisor.daemon.store import writer as store_writer
from supervisor.daemon.store.writer import Writer

from .batching import batch, committed


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[tuple[Writer, Path]]:
    path = tmp_path / "t.db"
    db = await aiosqlite.connect(path, isolation_level=None)
    await db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    try:
        yield Writer(db), path
    finally:
        await db.close()


async def test_a_failing_write_is_undone_alone_and_the_others_of_its_batch_commit(
    writer: tuple[Writer, Path],
) -> None:
    w, path = writer
    seen_by_others: list[list[str]] = []

    def first(db: sqlite3.Connection) -> str:
        db.execute("INSERT INTO t VALUES ('a1')")
        return "first"

    def bad(db: sqlite3.Connection) -> str:
        db.execute("INSERT INTO t VALUES ('b1')")  # written, then undone
        db.execute("INSERT INTO t VALUES ('a1')")  # a constraint: the op fails
        return "unreachable"

    def last(db: sqlite3.Connection) -> str:
        seen_by_others.append(committed(path))  # nothing of the batch is committed yet
        inside = [k for (k,) in db.execute("SELECT k FROM t ORDER BY k")]
        db.execute("INSERT INTO t VALUES ('c1')")
        return ",".join(inside)

    results = await batch(w, {"first": first, "bad": bad, "last": last})

    assert seen_by_others == [["l0"]], "the three writes were not one transaction"
    assert results["lead"] == "lead"
    assert results["first"] == "first"
    assert isinstance(results["bad"], sqlite3.IntegrityError)
    assert results["last"] == "a1,l0"  # inside the batch: the first's row, not the bad one's
    assert committed(path) == ["a1", "c1", "l0"]
    assert w.problem is None and w.failures == 0


async def test_a_lone_failing_write_is_rolled_back_and_the_next_one_commits(
    writer: tuple[Writer, Path],
) -> None:
    w, path = writer

    def bad(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t VALUES ('x')")
        db.execute("INSERT INTO missing VALUES (1)")

    def good(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t VALUES ('y')")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await w.write(bad)
    await w.write(good)
    assert committed(path) == ["y"]
    assert w.problem is None


def _insert(key: str) -> Callable[[sqlite3.Connection], None]:
    def op(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t VALUES (?)", (key,))

    return op


@contextlib.asynccontextmanager
async def writing(w: Writer) -> AsyncIterator[None]:
    """The writer task runs for the block."""
    async with anyio.create_task_group() as tg:
        await tg.start(w.run_writer)
        yield
        tg.cancel_scope.cancel()


async def test_a_write_that_may_wait_rides_along_with_the_next_commit(
    writer: tuple[Writer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    w, path = writer
    monkeypatch.setattr(store_writer, "LATER_S", 30.0)  # no deadline within the test
    seen: list[tuple[list[str], list[str]]] = []

    def awaited(db: sqlite3.Connection) -> None:
        inside = [k for (k,) in db.execute("SELECT k FROM t ORDER BY k")]
        seen.append((committed(path), inside))
        db.execute("INSERT INTO t VALUES ('b')")

    async with writing(w):
        w.write_later(_insert("a"))  # a pid: its keeper's journal holds it already
        for _ in range(5):  # the writer task runs, and holds it
            await anyio.sleep(0)
        assert committed(path) == []
        await w.write(awaited)
    # The queued write ran first, in the awaited write's own transaction: no commit of
    # its own, and its order kept.
    assert seen == [([], ["a"])]
    assert committed(path) == ["a", "b"]


async def test_a_write_that_may_wait_alone_commits_by_itself_soon(
    writer: tuple[Writer, Path],
) -> None:
    w, path = writer
    async with writing(w):
        w.write_later(_insert("a"))
        with anyio.fail_after(10):  # LATER_S (50 ms) on a quiet machine
            while committed(path) != ["a"]:
                await anyio.sleep(0.01)


async def test_settle_commits_what_waits_to_ride_along_at_once(
    writer: tuple[Writer, Path],
) -> None:
    w, path = writer
    async with writing(w):
        w.write_later(_insert("a"))
        w.write_later(_insert("b"))
        await w.settle()
        assert committed(path) == ["a", "b"]  # not left to the writer's deadline
        await w.settle()  # nothing waits: no commit
