"""The store's group-commit writer, and what it does when the disk says no.

A write with no commit in flight is committed at once by its own task; writes that come
while one is in flight queue, and the writer task commits them all in the next
transaction (group commit: under load, one transaction and one sync for many writes). A
caller's await returns only after its commit, so nothing is acknowledged before it is
durable. A transaction runs as one call on the connection's own thread: an op is a plain
function of the sqlite3 connection, so a commit costs one hand-over between the loop and
that thread, not one per statement. A write that did not commit raises StorageError (or,
for a write that nobody is waiting to hear refused, waits and is tried again): nothing is
acted on that was not recorded.

Two kinds of writes:
- a client request's first write fails fast: the client hears `storage` and nothing of
  its request was done (`Writer.answering()` marks the request's task);
- every other write (a job's start or end, a hold, an event) is patient: it stays queued
  and is retried until it commits, and its caller, awaiting it, does not act meanwhile.
While a commit fails, `problem` says why (health, metrics, the dispatch pause read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import aiosqlite
import anyio
import anyio.abc
import structlog

log = structlog.get_logger("gpusvd.store")
T = TypeVar("T")
Op = Callable[[sqlite3.Connection], T]  # runs on the connection's thread, inside the batch

RETRY_MIN_S, RETRY_MAX_S = 0.25, 5.0
LATER_S = 0.05  # the longest a write_later waits for a commit to ride along with
# SQLite's primary result codes that mean the disk, not the statement, failed.
_SQLITE_REASONS = {
    5: "database busy",
    6: "database locked",
    7: "out of memory",
    8: "read-only",
    10: "I/O error",
    11: "database corrupt",
    13: "disk full",
    14: "cannot open the database file",
    26: "not a database",
}
_OS_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only",
    errno.EIO: "I/O error",
    errno.EMFILE: "too many open files",
    errno.ENFILE: "too many open files",
}


def _task_id() -> int:
    """The current task's identity, as anyio's TaskInfo.id has it (the daemon runs on
    asyncio): read at every write, where building a TaskInfo cost more than the check."""
    return id(asyncio.current_task())


class StorageError(Exception):
    """A write did not commit for a reason of the storage: nothing of it was recorded."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"the state database could not record this ({reason}: {detail})")
        self.reason = reason
        self.detail = detail


def storage_reason(exc: BaseException) -> str | None:
    """The storage fault an exception reports (disk full, read-only, ...), or None when
    the statement itself failed (a constraint, a bug) and the disk is fine."""
    if isinstance(exc, StorageError):
        return exc.reason
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return _SQLITE_REASONS.get(code & 0xFF)
        text = str(exc).lower()
        for needle, reason in (("full", "disk full"), ("readonly", "read-only"), ("i/o", "I/O")):
            if needle in text:
                return reason
        return None
    if isinstance(exc, OSError) and exc.errno is not None:
        return _OS_REASONS.get(exc.errno)
    return None


@dataclass
class _Write:
    op: Op[Any]
    patient: bool
    done: anyio.Event = field(default_factory=anyio.Event)
    box: list[Any] = field(default_factory=list)
    awaited: bool = True  # False: write_later's, whose failure only the log hears of


class Writer:
    """Owns the connection's write transactions (Store adds the queries)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db
        self._pending: list[_Write] = []
        self._wake = anyio.Event()
        self._writer_running = False
        self._flushing = 0  # commits in flight
        self._answering: set[int] = set()  # tasks whose next write fails fast
        self.problem: str | None = None  # why commits fail now; None while they succeed
        self.failures = 0  # commits that failed for the storage, since start
        self._retry_s = RETRY_MIN_S
        self._later_at: float | None = None  # when the queued write_later's commit is due
        self._releases: list[Callable[[], None]] = []  # see on_settle

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """The current task's next write fails fast with StorageError instead of waiting
        for the disk: a client hears at once that its request was not recorded. Only the
        first: once a request has changed something, its further writes must land too."""
        task = _task_id()
        self._answering.add(task)
        try:
            yield
        finally:
            self._answering.discard(task)

    def is_answering(self) -> bool:
        """Whether the current task's next write would fail fast."""
        return _task_id() in self._answering

    async def write(self, op: Op[T]) -> T:
        """Run op inside the next group transaction; return once it is committed."""
        task = _task_id()
        fail_fast = task in self._answering or not self._writer_running
        self._answering.discard(task)
        w = _Write(op, patient=not fail_fast)
        self._pending.append(w)
        if not self._writer_running or (not self._flushing and self.problem is None):
            # Nothing in flight: this task commits what is queued itself, without handing
            # over to the writer task. Writes that come meanwhile queue for the writer,
            # which commits them together next (the connection's thread runs one
            # transaction at a time, in the order they were handed to it).
            await self.flush()
        else:
            self._wake.set()
        if not w.done.is_set():
            await w.done.wait()
        if isinstance(w.box[0], BaseException):
            raise w.box[0]
        return cast(T, w.box[0])

    def write_later(self, op: Op[Any]) -> None:
        """Queue op for a group transaction without waiting for it: patient (kept and
        retried while the storage fails), in order with every other write. It rides
        along with the next commit that starts, or has one of its own LATER_S after it
        was queued: under load a pid costs no commit of its own (one job in four had
        one), and alone it lands within LATER_S."""
        self._pending.append(_Write(op, patient=True, awaited=False))
        if self._later_at is None:
            self._later_at = time.monotonic() + LATER_S
            self._wake.set()  # the writer learns of the deadline

    def on_settle(self, release: Callable[[], None]) -> None:
        """`release` hands the writer what its caller holds back to ride along (the
        engine's pids), first thing in every settle."""
        self._releases.append(release)

    async def settle(self) -> None:
        """Commit the writes that wait to ride along, now (a reader that must see them)."""
        for release in self._releases:
            release()
        if self.problem is None and any(not w.awaited for w in self._pending):
            await self.flush()

    async def run_writer(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._writer_running = True
        task_status.started()
        try:
            while True:
                with anyio.move_on_after(self._wait_s()):
                    await self._wake.wait()
                self._wake = anyio.Event()
                if not self._holding():
                    await self.flush()
        finally:
            self._writer_running = False

    def _wait_s(self) -> float:
        # While commits fail, try again after a backoff even with nothing new: a patient
        # write is queued, or a probe tells when the disk is back.
        if self.problem is not None:
            return self._retry_s
        if self._later_at is not None:
            return max(0.0, self._later_at - time.monotonic())
        return 0.0 if self._pending else float("inf")  # kept from a failed commit: due

    def _holding(self) -> bool:
        """Only writes that may wait are queued, and their LATER_S has not passed."""
        return (
            self.problem is None
            and self._later_at is not None
            and time.monotonic() < self._later_at
            and not any(w.awaited for w in self._pending)
        )

    async def flush(self) -> None:
        """Commit everything queued so far in one transaction."""
        batch, self._pending = self._pending, []
        self._later_at = None
        if not batch:
            if self.problem is not None:
                await self._probe()
            return
        self._flushing += 1
        try:
            with anyio.CancelScope(shield=True):
                failure = await self._commit(batch)
        finally:
            self._flushing -= 1
        if self._pending or failure is not None:
            self._wake.set()  # the writer task takes what came meanwhile, or retries
        if failure is None:
            self._succeeded()
            for w in batch:
                w.done.set()
                if not w.awaited and isinstance(w.box[0], BaseException):
                    log.error("a queued write failed", error=repr(w.box[0]))
            return
        error = self._failed(failure)
        kept = []
        for w in batch:
            w.box.clear()
            if w.patient:
                kept.append(w)
            else:
                w.box.append(error)
                w.done.set()
        self._pending[:0] = kept  # first again, in their order

    async def _commit(self, batch: list[_Write]) -> BaseException | None:
        """One transaction for the batch: None once committed, else the storage failure
        (every write of the batch is then unrecorded)."""
        db = self.db
        # aiosqlite runs each call on the connection's thread; `_execute` hands it the
        # whole transaction at once (its public calls would hand over every statement).
        on_thread = cast(Callable[[Callable[[], Any]], Awaitable[Any]], db._execute)
        failure: BaseException | None = await on_thread(lambda: _transaction(db._conn, batch))
        return failure

    async def _probe(self) -> None:
        """A write of nothing that matters (the schema version, unchanged): it commits
        once the database can be written again."""
        async with self.db.execute("PRAGMA user_version") as cur:
            version = int((await cur.fetchone() or (0,))[0])

        def op(db: sqlite3.Connection) -> None:
            db.execute(f"PRAGMA user_version={version}")

        with anyio.CancelScope(shield=True):
            failure = await self._commit([_Write(op, patient=True)])
        if failure is None:
            self._succeeded()
        else:
            self._failed(failure)

    def _failed(self, exc: BaseException) -> StorageError:
        reason = storage_reason(exc) or "database error"
        detail = str(exc) or type(exc).__name__
        self.failures += 1
        if self.problem is None:
            log.error(
                "the state database cannot be written: no job starts until it can; "
                "running jobs go on and their writes are retried",
                reason=reason,
                error=detail,
            )
            self._retry_s = RETRY_MIN_S
        else:
            self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)
        self.problem = f"state database cannot be written ({reason}: {detail})"
        return exc if isinstance(exc, StorageError) else StorageError(reason, detail)

    def _succeeded(self) -> None:
        if self.problem is not None:
            log.warning("the state database can be written again", was=self.problem)
        self.problem = None
        self._retry_s = RETRY_MIN_S


def _transaction(db: sqlite3.Connection, batch: list[_Write]) -> BaseException | None:
    """On the connection's thread: the batch in one transaction. A write whose own
    statement fails gets its exception and is left out, without undoing the others.

    The writes are first run as they are, with no savepoint each (two statements a write,
    and a GIL hand-over each, in every group commit): only when one of them fails for
    its own statement is the transaction rolled back and the batch run again, each write
    in a savepoint of its own. An op is a function of the connection alone, run again
    as a retried commit runs it."""
    try:
        db.execute("BEGIN IMMEDIATE")
        if len(batch) == 1:  # alone, the transaction itself is the unit to roll back
            w = batch[0]
            try:
                w.box.append(w.op(db))
            except Exception as exc:
                if storage_reason(exc) is not None:
                    raise
                db.rollback()
                w.box.append(exc)
                return None
        elif not _all_at_once(db, batch):
            db.execute("BEGIN IMMEDIATE")
            for w in batch:
                _savepoint(db, w)
        db.commit()
    except Exception as exc:
        with contextlib.suppress(Exception):  # a full disk may have rolled it back
            db.rollback()
        return exc
    return None


def _all_at_once(db: sqlite3.Connection, batch: list[_Write]) -> bool:
    """Every write of the batch, in the open transaction; False (the transaction rolled
    back, no write's result kept) when one failed for its own statement."""
    results = []
    for w in batch:
        try:
            results.append(w.op(db))
        except Exception as exc:
            if storage_reason(exc) is not None:
                raise
            db.rollback()
            return False
    for w, result in zip(batch, results, strict=True):
        w.box.append(result)
    return True


def _savepoint(db: sqlite3.Connection, w: _Write) -> None:
    db.execute("SAVEPOINT op")
    try:
        w.box.append(w.op(db))
        db.execute("RELEASE op")
    except Exception as exc:  # one bad op must not undo the others
        if storage_reason(exc) is not None:
            raise
        db.execute("ROLLBACK TO op")
        db.execute("RELEASE op")
        w.box.append(exc)
