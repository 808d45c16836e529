"""SQLite persistence: every query (the group-commit writer: store_writer.py; the schema:
store_schema.py). A write returns only once committed and raises when it did not."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import structlog

from supervisor.core.jobs import Job
from supervisor.core.records import Attempt, Event
from supervisor.daemon.store import output_files
from supervisor.daemon.store.guard import (
    IdMark,
    StoreOpenError,
    check_database_file,
    newest_log_id,
    prepare,
)
from supervisor.daemon.store.schema import (
    ATTEMPT_COLUMNS,
    JOB_COLUMNS,
    MemRow,
    _row_to_attempt,
    _row_to_job,
    _Specs,
)
from supervisor.daemon.store.writer import StorageError, Writer
from supervisor.wire import jsonline

__all__ = [
    "Attempt",
    "Event",
    "MemRow",
    "StorageError",
    "Store",
    "StoreOpenError",
]  # the records are the store's API
log = structlog.get_logger("gpusvd.events")


READ_CHUNK = 500  # ids per `IN (...)`: well under SQLite's limit on bound parameters


class Store(Writer):
    """Owns the database connection; writes go through the group-commit Writer."""

    ids: IdMark | None = None

    @classmethod
    async def open(cls, path: Path) -> Store:
        """Open, check and migrate the database; StoreOpenError (one line) when it
        cannot be used, with no thread left behind to keep the process alive."""
        logs_dir = output_files.logs_dir(path.parent)
        check_database_file(path, logs_dir)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.close(fd)
            os.chmod(path, 0o600)
            ids = IdMark(path, logs_dir)
        except OSError as exc:
            raise StoreOpenError(f"{path}: {exc.strerror}") from None
        try:
            db = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            ids.close()
            raise StoreOpenError(f"{path}: {exc}") from None
        store = cls(db)
        store.ids = ids
        try:
            newest = await prepare(db, max(ids.value, newest_log_id(logs_dir)))
            ids.raise_to(newest)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await store.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreOpenError(f"{path}: {exc}: restore it or move it away") from None
            raise
        return store

    async def close(self) -> None:
        try:
            await self.db.close()
        finally:
            if self.ids is not None:
                self.ids.close()
                self.ids = None

    # ---- writes ---------------------------------------------------------------------

    async def add_daemon_event(self, at: str, kind: str, data: dict[str, Any]) -> None:
        def op(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO daemon_events (at, kind, data) VALUES (?, ?, ?)",
                (at, kind, jsonline.dumps(data)),
            )

        await self.write(op)

    # ---- reads ----------------------------------------------------------------------

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        # One hand-over to the connection's thread, not three (execute, fetch, close):
        # each is a wake of that thread and of the loop, some 0.1 ms of a request's wait.
        return list(await self.db.execute_fetchall(sql, tuple(params)))

    async def active_jobs(self) -> list[Job]:
        rows = await self._all(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('queued', 'running') ORDER BY id"
        )
        specs = _Specs()
        return [_row_to_job(r, specs) for r in rows]

    async def get_jobs(self, ids: Sequence[int]) -> dict[int, Job]:
        """The stored jobs of those ids (a few queries, not one per id)."""
        out: dict[int, Job] = {}
        specs = _Specs()
        for i in range(0, len(ids), READ_CHUNK):
            chunk = ids[i : i + READ_CHUNK]
            marks = ",".join("?" * len(chunk))
            for r in await self._all(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({marks})", chunk
            ):
                job = _row_to_job(r, specs)
                out[job.id] = job
        return out

    async def get_job(self, job_id: int) -> Job | None:
        rows = await self._all(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,))
        return _row_to_job(rows[0]) if rows else None

    async def list_jobs(
        self, states: Sequence[str], limit: int, before_id: int | None, array: int | None = None
    ) -> list[Job]:
        where: list[str] = []
        params: list[Any] = []
        if array is not None:
            where.append("json_extract(spec, '$.array_id') = ?")
            params.append(array)
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params.extend(states)
        if before_id is not None:
            where.append("id < ?")
            params.append(before_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._all(
            f"SELECT {JOB_COLUMNS} FROM jobs {clause} ORDER BY id DESC LIMIT ?",
            [*params, limit],
        )
        specs = _Specs()
        return [_row_to_job(r, specs) for r in rows]

    async def attempts(self, job_id: int) -> list[Attempt]:
        rows = await self._all(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id=? ORDER BY n", (job_id,)
        )
        return [_row_to_attempt(r) for r in rows]

    async def open_attempts(self) -> list[Attempt]:
        rows = await self._all(f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE ended_at IS NULL")
        return [_row_to_attempt(r) for r in rows]

    async def events(self, job_id: int) -> list[dict[str, Any]]:
        rows = await self._all(
            "SELECT at, kind, message, data FROM events WHERE job_id=? ORDER BY id", (job_id,)
        )
        out = []
        for at, kind, message, data in rows:
            ev = {"at": at, "kind": kind, "message": message}
            if data:
                ev.update(json.loads(data))
            out.append(ev)
        return out

    async def mem_history(self, key: str, limit: int = 50) -> list[MemRow]:
        """The key's finished attempts that measured a peak, oldest first."""
        rows = await self._all(
            "SELECT peak_rss_mb, reason, mem_scale, peak_vram_mb FROM attempts "
            "WHERE mem_key=? AND ended_at IS NOT NULL AND peak_rss_mb IS NOT NULL "
            "ORDER BY ended_at DESC LIMIT ?",
            (key, limit),
        )
        return [MemRow(r[0], r[1], r[2], r[3]) for r in reversed(rows)]

    async def count_by(self, column: str) -> dict[str, int]:
        assert column in ("state", "reason")
        rows = await self._all(
            f"SELECT {column}, COUNT(*) FROM jobs WHERE {column} IS NOT NULL GROUP BY {column}"
        )
        return {r[0]: r[1] for r in rows}

    async def attempt_failures(self) -> dict[str, int]:
        rows = await self._all(
            "SELECT reason, COUNT(*) FROM attempts WHERE reason IS NOT NULL GROUP BY reason"
        )
        return {r[0]: r[1] for r in rows}

    async def request_ids(self, uid: int, request_id: str) -> list[int] | None:
        """The ids a submit with this request id made for this user, or None."""
        rows = await self._all(
            "SELECT first_id, count FROM submit_requests WHERE owner_uid=? AND request_id=?",
            (uid, request_id),
        )
        return list(range(rows[0][0], rows[0][0] + rows[0][1])) if rows else None

    async def queued_count(self, uid: int) -> int:
        rows = await self._all(
            "SELECT COUNT(*) FROM jobs WHERE owner_uid=? AND state IN ('queued','running')",
            (uid,),
        )
        return int(rows[0][0])

    async def hangs(self, limit: int = 1000) -> list[dict[str, Any]]:
        rows = await self._all(
            "SELECT job_id, attempt, gpu, pci_bus_id, driver_version, at, evidence, "
            "host_mem_available_mb, swap_used_mb, vram_used_mb, labels, name, frame FROM hangs "
            "ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        keys = (
            "job",
            "attempt",
            "gpu",
            "pci_bus_id",
            "driver_version",
            "at",
            "evidence",
            "host_mem_available_mb",
            "swap_used_mb",
            "vram_used_mb",
            "labels",
            "name",
            "frame",
        )
        out = []
        for r in reversed(rows):
            item = dict(zip(keys, r, strict=True))
            item["evidence"] = json.loads(item["evidence"]) if item["evidence"] else None
            item["labels"] = json.loads(item["labels"]) if item["labels"] else {}
            out.append(item)
        return out

    async def owners(self, job_ids: set[int]) -> dict[int, int]:
        if not job_ids:
            return {}
        marks = ",".join("?" * len(job_ids))
        rows = await self._all(
            f"SELECT id, owner_uid FROM jobs WHERE id IN ({marks})", sorted(job_ids)
        )
        return {r[0]: r[1] for r in rows}

    async def hang_counts(self, *columns: str) -> dict[tuple[Any, ...], int]:
        """Hang records counted by the given columns (all of them, not a recent page)."""
        assert columns and set(columns) <= {"gpu", "pci_bus_id", "driver_version", "job_id"}
        cols = ", ".join(columns)
        rows = await self._all(f"SELECT {cols}, COUNT(*) FROM hangs GROUP BY {cols}")
        return {tuple(r[:-1]): r[-1] for r in rows}

    async def daemon_events(self, kind: str) -> list[dict[str, Any]]:
        rows = await self._all(
            "SELECT at, data FROM daemon_events WHERE kind=? ORDER BY id", (kind,)
        )
        return [{**json.loads(data), "at": at} for at, data in rows]
