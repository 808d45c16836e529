"""What the store checks before it trusts its database, and the ids' high-water mark.

A database that cannot be read is a one-line error at start (gpusvd exits 2), never a
traceback, a hang, or an empty start over the state of earlier jobs. Job ids are never
handed out twice, even when the database lost its tail (restored from a backup, a lost
WAL): the highest id handed out is also kept in a file of its own (and a copy of it in
the logs directory), and a start continues after the newest id that the database, that
file, its copy or a job's log names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import aiosqlite
import structlog

from supervisor.daemon.store.rekey import rekey
from supervisor.daemon.store.schema import MIGRATIONS, SCHEMA_VERSION

log = structlog.get_logger("gpusvd.store")

_LOG_NAME = re.compile(r"^(\d+)\.(out|err)$")
ID_COPY = "newest-id"  # the id mark's copy among the logs, where a job that wrote nothing has none


class StoreOpenError(Exception):
    """The database cannot be used: gpusvd prints this one line and exits 2."""


def newest_log_id(logs_dir: Path) -> int:
    """The highest job id that has a log under logs_dir (0: none)."""
    newest = 0
    try:
        with os.scandir(logs_dir) as entries:
            for entry in entries:
                m = _LOG_NAME.match(entry.name)
                if m:
                    newest = max(newest, int(m.group(1)))
    except FileNotFoundError:
        return 0
    try:
        return max(newest, _parse((logs_dir / ID_COPY).read_bytes()))
    except OSError:
        return newest


def check_database_file(path: Path, logs_dir: Path) -> None:
    """Refuse a database path that is not a file, or an empty one beside earlier jobs'
    logs: starting afresh there would hand out their ids again."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise StoreOpenError(f"{path} is not a regular file")
    empty = not path.exists() or path.stat().st_size == 0
    if empty and not _has_wal(path):
        newest = newest_log_id(logs_dir)
        if newest:
            raise StoreOpenError(
                f"{path} is {'empty' if path.exists() else 'missing'} but {logs_dir} holds "
                f"logs of jobs up to {newest}: restore the database, or move {logs_dir} "
                "away to start afresh"
            )


def _has_wal(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    return wal.exists() and wal.stat().st_size > 0


class IdMark:
    """The highest id ever handed out, in a file of its own, written (in place, one
    fixed-width record) inside every transaction that inserts jobs, before it commits.
    Not fsynced: SQLite's synchronous=FULL already keeps a committed tail across a power
    loss; this mark keeps ids unique across what SQLite cannot see (a database restored
    from a backup, a lost WAL file, a lost tail of any kind while the machine ran). A copy
    goes to the logs directory (`ID_COPY`), where a restore of the state files does not
    reach and a job that wrote nothing left no log of its own."""

    def __init__(self, db_path: Path, logs_dir: Path | None = None) -> None:
        self.path = db_path.with_name(db_path.name + ".ids")
        self.fd = _open_mark(self.path)
        self.value = _parse(os.pread(self.fd, 64, 0))
        self.copy = -1  # the copy: a fallback, never a reason to refuse a start or a write
        if logs_dir is not None:
            try:
                logs_dir.mkdir(exist_ok=True)
                self.copy = _open_mark(logs_dir / ID_COPY)
                if not os.pread(self.copy, 64, 0):  # its block taken now, not in a transaction
                    os.pwrite(self.copy, _record(self.value), 0)
            except OSError as exc:  # a full or read-only logs directory: tried at next start
                log.warning("the id mark's copy is not kept", path=str(logs_dir), why=str(exc))
                self._drop_copy()

    def raise_to(self, last_id: int) -> None:
        if last_id > self.value:
            os.pwrite(self.fd, _record(last_id), 0)
            if self.copy >= 0:
                try:
                    os.pwrite(self.copy, _record(last_id), 0)
                except OSError:
                    self._drop_copy()
            self.value = last_id

    def _drop_copy(self) -> None:
        if self.copy >= 0:
            os.close(self.copy)
            self.copy = -1

    def close(self) -> None:
        self._drop_copy()
        os.close(self.fd)


def _open_mark(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _record(last_id: int) -> bytes:
    return f"{last_id:020d}\n".encode()


def _parse(record: bytes) -> int:
    """A mark's id; 0 for a torn or empty one (the other marks and the logs still count)."""
    raw = record.decode("ascii", "replace").strip()
    return int(raw) if raw.isdigit() else 0


async def prepare(db: aiosqlite.Connection, id_floor: int) -> int:
    """Set the connection up, migrate, check; returns the newest job id handed out.
    Raises StoreOpenError, or sqlite3.Error for a file SQLite cannot read."""
    await db.execute("PRAGMA journal_mode=WAL")
    await db.execute("PRAGMA synchronous=FULL")
    await db.execute("PRAGMA foreign_keys=ON")
    await db.execute("PRAGMA busy_timeout=5000")
    await _migrate(db)
    await rekey(db)  # once: keys of the earlier rule become today's (store/rekey.py)
    # Kept beside the versioned schema: a table that no migration of the jobs touches.
    await db.execute(
        "CREATE TABLE IF NOT EXISTS submit_requests (owner_uid INTEGER NOT NULL, "
        "request_id TEXT NOT NULL, first_id INTEGER NOT NULL, count INTEGER NOT NULL, "
        "PRIMARY KEY (owner_uid, request_id)) WITHOUT ROWID"
    )
    async with db.execute("PRAGMA quick_check") as cur:
        verdict = str((await cur.fetchone() or ("ok",))[0])
    if verdict != "ok":
        raise StoreOpenError(f"the state database fails its integrity check: {verdict}")
    return await _ids_above(db, id_floor)


async def _migrate(db: aiosqlite.Connection) -> None:
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    current = int(row[0]) if row else 0
    if current > SCHEMA_VERSION:
        raise StoreOpenError(
            f"the state database has schema {current}, newer than this gpusvd's "
            f"({SCHEMA_VERSION}): run a newer gpusvd, or restore an older database"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        await db.execute("BEGIN IMMEDIATE")
        for statement in MIGRATIONS[version].split(";"):
            if statement.strip():
                await db.execute(statement)
        await db.execute(f"PRAGMA user_version={version}")
        await db.commit()


async def _ids_above(db: aiosqlite.Connection, floor: int) -> int:
    """Continue ids after `floor` (the id mark's, a job log's) when the database's own
    sequence is behind it: its tail was lost, and those ids were handed out."""
    async with db.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'") as cur:
        seq = await cur.fetchone()
    async with db.execute("SELECT MAX(id) FROM jobs") as cur:
        newest = await cur.fetchone()
    current = max(int(seq[0]) if seq else 0, int(newest[0] or 0) if newest else 0)
    if floor <= current:
        return current
    await db.execute("BEGIN IMMEDIATE")
    await db.execute("DELETE FROM sqlite_sequence WHERE name='jobs'")
    await db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", (floor,))
    await db.commit()
    log.warning(
        "the database is behind the ids already handed out: ids continue after them",
        database_newest=current,
        handed_out=floor,
    )
    return floor
