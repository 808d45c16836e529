"""SQLite persistence: schema, migrations and every query. The only SQL in the project.

Writes go through one writer task that commits everything queued in the same loop turn
in one transaction (group commit); a caller's await returns only after that commit, so
nothing is acknowledged before it is durable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite
import anyio
import structlog

from .jobs import FailureReason, Job, JobSpec, JobState

log = structlog.get_logger("gpusvd.events")
T = TypeVar("T")
Op = Callable[[aiosqlite.Connection], Awaitable[T]]

SCHEMA_VERSION = 1

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        spec TEXT NOT NULL,
        env TEXT NOT NULL,
        owner_uid INTEGER NOT NULL,
        mem_key TEXT NOT NULL,
        priority INTEGER NOT NULL,
        state TEXT NOT NULL,
        submitted_at TEXT NOT NULL,
        started_at TEXT,
        ended_at TEXT,
        waiting_for TEXT,
        hold_reason TEXT,
        reason TEXT,
        exit_code INTEGER,
        ordinary_used INTEGER NOT NULL DEFAULT 0,
        gpu_hang_used INTEGER NOT NULL DEFAULT 0,
        gpus TEXT NOT NULL DEFAULT '[]',
        attempts INTEGER NOT NULL DEFAULT 0,
        not_before REAL NOT NULL DEFAULT 0,
        progress TEXT
    );
    CREATE INDEX jobs_active ON jobs(state, priority DESC, id)
        WHERE state IN ('queued', 'running');
    CREATE INDEX jobs_owner_state ON jobs(owner_uid, state);
    CREATE TABLE attempts (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        n INTEGER NOT NULL,
        gpus TEXT NOT NULL,
        pid INTEGER,
        pid_start REAL,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        exit_code INTEGER,
        signal INTEGER,
        reason TEXT,
        peak_rss_mb INTEGER,
        peak_vram_mb INTEGER,
        evidence TEXT,
        mem_key TEXT NOT NULL,
        mem_scale REAL,
        PRIMARY KEY (job_id, n)
    );
    CREATE INDEX attempts_key ON attempts(mem_key, ended_at) WHERE ended_at IS NOT NULL;
    CREATE INDEX attempts_open ON attempts(job_id) WHERE ended_at IS NULL;
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        data TEXT
    );
    CREATE INDEX events_job ON events(job_id);
    CREATE TABLE hangs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER,
        attempt INTEGER,
        gpu INTEGER,
        pci_bus_id TEXT,
        driver_version TEXT,
        at TEXT NOT NULL,
        evidence TEXT,
        host_mem_available_mb INTEGER,
        swap_used_mb INTEGER,
        vram_used_mb INTEGER,
        labels TEXT
    );
    CREATE TABLE daemon_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT
    );
    """,
}


@dataclass(frozen=True)
class Attempt:
    job_id: int
    n: int
    gpus: tuple[int, ...]
    started_at: str
    mem_key: str
    mem_scale: float | None = None
    pid: int | None = None
    pid_start: float | None = None
    ended_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    peak_rss_mb: int | None = None
    peak_vram_mb: int | None = None
    evidence: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "gpus": list(self.gpus),
            "pid": self.pid,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "peak_rss_mb": self.peak_rss_mb,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Event:
    kind: str
    message: str
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class MemRow:
    peak_rss_mb: int
    reason: str | None
    scale: float | None
    peak_vram_mb: int | None


# ---- row mapping ------------------------------------------------------------------------

JOB_COLUMNS = (
    "id, spec, env, state, submitted_at, started_at, ended_at, waiting_for, hold_reason, "
    "reason, exit_code, ordinary_used, gpu_hang_used, gpus, attempts, not_before, progress"
)


def _spec_json(spec: JobSpec) -> str:
    # Shallow: a spec holds only plain values, and asdict's deep copy is slow for a batch.
    return json.dumps({f.name: getattr(spec, f.name) for f in fields(spec) if f.name != "env"})


class _Specs:
    """Specs parsed for one read of many rows: the jobs of a batch (one spec, or one
    environment) are parsed once and held in memory once."""

    def __init__(self) -> None:
        self.specs: dict[tuple[str, str], JobSpec] = {}
        self.envs: dict[str, dict[str, str]] = {}

    def get(self, spec_json: str, env_json: str) -> JobSpec:
        spec = self.specs.get((spec_json, env_json))
        if spec is None:
            env = self.envs.get(env_json)
            if env is None:
                env = self.envs[env_json] = json.loads(env_json)
            data = json.loads(spec_json)
            data["argv"] = tuple(data["argv"])
            data["after"] = tuple(data.get("after", ()))
            spec = self.specs[(spec_json, env_json)] = JobSpec(env=env, **data)
        return spec


def _row_to_job(row: Sequence[Any], specs: _Specs | None = None) -> Job:
    return Job(
        id=row[0],
        spec=(specs or _Specs()).get(row[1], row[2]),
        state=JobState(row[3]),
        submitted_at=row[4],
        started_at=row[5],
        ended_at=row[6],
        waiting_for=row[7],
        hold_reason=row[8],
        reason=FailureReason(row[9]) if row[9] else None,
        exit_code=row[10],
        ordinary_used=row[11],
        gpu_hang_used=row[12],
        gpus=tuple(json.loads(row[13])),
        attempts=row[14],
        not_before=row[15],
        progress=row[16],
    )


def _row_to_attempt(row: Sequence[Any]) -> Attempt:
    return Attempt(
        job_id=row[0],
        n=row[1],
        gpus=tuple(json.loads(row[2])),
        pid=row[3],
        pid_start=row[4],
        started_at=row[5],
        ended_at=row[6],
        exit_code=row[7],
        signal=row[8],
        reason=row[9],
        peak_rss_mb=row[10],
        peak_vram_mb=row[11],
        evidence=json.loads(row[12]) if row[12] else None,
        mem_key=row[13],
        mem_scale=row[14],
    )


ATTEMPT_COLUMNS = (
    "job_id, n, gpus, pid, pid_start, started_at, ended_at, exit_code, signal, reason, "
    "peak_rss_mb, peak_vram_mb, evidence, mem_key, mem_scale"
)


UPDATE_JOB = (
    "UPDATE jobs SET state=?, started_at=?, ended_at=?, waiting_for=?, hold_reason=?, "
    "reason=?, exit_code=?, ordinary_used=?, gpu_hang_used=?, gpus=?, attempts=?, "
    "not_before=?, progress=? WHERE id=?"
)
INSERT_EVENT = "INSERT INTO events (job_id, at, kind, message, data) VALUES (?, ?, ?, ?, ?)"


async def _update_job(db: aiosqlite.Connection, job: Job) -> None:
    await db.execute(UPDATE_JOB, _job_params(job))


def _job_params(job: Job) -> tuple[Any, ...]:
    return (
        job.state.value,
        job.started_at,
        job.ended_at,
        job.waiting_for,
        job.hold_reason,
        job.reason.value if job.reason else None,
        job.exit_code,
        job.ordinary_used,
        job.gpu_hang_used,
        json.dumps(list(job.gpus)),
        job.attempts,
        job.not_before,
        job.progress,
        job.id,
    )


def _event_params(job_id: int | None, at: str, ev: Event) -> tuple[Any, ...]:
    return (job_id, at, ev.kind, ev.message, json.dumps(ev.data) if ev.data else None)


async def _insert_event(db: aiosqlite.Connection, job_id: int | None, at: str, ev: Event) -> None:
    await db.execute(INSERT_EVENT, _event_params(job_id, at, ev))


async def _insert_attempt(db: aiosqlite.Connection, a: Attempt) -> None:
    await db.execute(
        f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            a.job_id,
            a.n,
            json.dumps(list(a.gpus)),
            a.pid,
            a.pid_start,
            a.started_at,
            a.ended_at,
            a.exit_code,
            a.signal,
            a.reason,
            a.peak_rss_mb,
            a.peak_vram_mb,
            json.dumps(a.evidence) if a.evidence else None,
            a.mem_key,
            a.mem_scale,
        ),
    )


async def _finish_attempt(db: aiosqlite.Connection, a: Attempt) -> None:
    await db.execute(
        "UPDATE attempts SET ended_at=?, exit_code=?, signal=?, reason=?, peak_rss_mb=?, "
        "peak_vram_mb=?, evidence=? WHERE job_id=? AND n=?",
        (
            a.ended_at,
            a.exit_code,
            a.signal,
            a.reason,
            a.peak_rss_mb,
            a.peak_vram_mb,
            json.dumps(a.evidence) if a.evidence else None,
            a.job_id,
            a.n,
        ),
    )


class Store:
    """Owns the database connection and the group-commit writer."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db
        self._pending: list[tuple[Op[Any], anyio.Event, list[Any]]] = []
        self._wake = anyio.Event()
        self._writer_running = False

    @classmethod
    async def open(cls, path: Path) -> Store:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        os.chmod(path, 0o600)
        db = await aiosqlite.connect(path, isolation_level=None)
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=FULL")
        await db.execute("PRAGMA foreign_keys=ON")
        await db.execute("PRAGMA busy_timeout=5000")
        store = cls(db)
        await store._migrate()
        return store

    async def _migrate(self) -> None:
        async with self.db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"state database schema {current} is newer than this gpusvd ({SCHEMA_VERSION})"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await self.db.execute("BEGIN IMMEDIATE")
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    await self.db.execute(statement)
            await self.db.execute(f"PRAGMA user_version={version}")
            await self.db.commit()

    async def close(self) -> None:
        await self.db.close()

    # ---- the writer -----------------------------------------------------------------

    async def write(self, op: Op[T]) -> T:
        """Run op inside the next group transaction; return once it is committed."""
        done = anyio.Event()
        box: list[Any] = []
        self._pending.append((op, done, box))
        if self._writer_running:
            self._wake.set()
        else:  # before the writer task starts (start-up) or after it stopped
            await self.flush()
        await done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return cast(T, box[0])

    async def run_writer(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._writer_running = True
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                await self.flush()
        finally:
            self._writer_running = False

    async def flush(self) -> None:
        """Commit everything queued so far in one transaction."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        with anyio.CancelScope(shield=True):
            await self.db.execute("BEGIN IMMEDIATE")
            if len(batch) == 1:  # alone, the transaction itself is the unit to roll back
                await self._commit_one(*batch[0])
                return
            for op, _done, box in batch:
                await self.db.execute("SAVEPOINT op")
                try:
                    box.append(await op(self.db))
                    await self.db.execute("RELEASE op")
                except Exception as exc:  # one bad op must not undo the others
                    await self.db.execute("ROLLBACK TO op")
                    await self.db.execute("RELEASE op")
                    box.append(exc)
            await self.db.commit()
        for _op, done, _box in batch:
            done.set()

    async def _commit_one(self, op: Op[Any], done: anyio.Event, box: list[Any]) -> None:
        try:
            box.append(await op(self.db))
            await self.db.commit()
        except Exception as exc:
            await self.db.rollback()
            box.append(exc)
        done.set()

    # ---- writes ---------------------------------------------------------------------

    async def insert_jobs(self, specs: Sequence[JobSpec], at: str) -> list[int]:
        envs: dict[int, str] = {}  # a batch shares one env: encode it once

        def row(spec: JobSpec) -> tuple[Any, ...]:
            env = envs.get(id(spec.env)) or envs.setdefault(id(spec.env), json.dumps(spec.env))
            return (_spec_json(spec), env, spec.owner_uid, spec.mem_key, spec.priority, at)

        async def op(db: aiosqlite.Connection) -> list[int]:
            await db.executemany(
                "INSERT INTO jobs (spec, env, owner_uid, mem_key, priority, state, "
                "submitted_at) VALUES (?, ?, ?, ?, ?, 'queued', ?)",
                [row(spec) for spec in specs],
            )
            # The writer holds the only write transaction: AUTOINCREMENT ids are consecutive.
            async with db.execute("SELECT last_insert_rowid()") as cur:
                last = int((await cur.fetchone() or (0,))[0])
            ids = list(range(last - len(specs) + 1, last + 1))
            submitted = Event("submitted", "submitted")
            await db.executemany(INSERT_EVENT, [_event_params(i, at, submitted) for i in ids])
            return ids

        ids = await self.write(op)
        if len(ids) <= 10:
            for job_id in ids:
                log.info("submitted", event_kind="submitted", job_id=job_id, state="queued")
        else:  # a batch: one line, not ten thousand
            log.info("submitted", event_kind="submitted", job_ids=f"{ids[0]}-{ids[-1]}")
        return ids

    async def save(
        self,
        job: Job,
        at: str,
        event: Event | Sequence[Event] | None = None,
        *,
        new_attempt: Attempt | None = None,
        ended_attempt: Attempt | None = None,
    ) -> None:
        """One state change with its event (and attempt row), as one unit."""

        async def op(db: aiosqlite.Connection) -> None:
            await _update_job(db, job)
            if new_attempt is not None:
                await _insert_attempt(db, new_attempt)
            if ended_attempt is not None:
                await _finish_attempt(db, ended_attempt)
            events = [event] if isinstance(event, Event) else list(event or ())
            for ev in events:
                await _insert_event(db, job.id, at, ev)

        await self.write(op)
        for ev in [event] if isinstance(event, Event) else list(event or ()):
            log.info(ev.message, event_kind=ev.kind, job_id=job.id, state=job.state.value)

    async def save_many(self, changes: Sequence[tuple[Job, Event]], at: str) -> None:
        """Many state changes, each with its event, in one unit (e.g. a pass's holds)."""

        async def op(db: aiosqlite.Connection) -> None:
            await db.executemany(UPDATE_JOB, [_job_params(job) for job, _ in changes])
            await db.executemany(INSERT_EVENT, [_event_params(j.id, at, e) for j, e in changes])

        await self.write(op)
        for job, ev in changes[:10]:
            log.info(ev.message, event_kind=ev.kind, job_id=job.id, state=job.state.value)
        if len(changes) > 10:  # a big queue: one line, not ten thousand
            log.info(f"and {len(changes) - 10} more", event_kind=changes[-1][1].kind)

    async def set_attempt_pid(self, a: Attempt) -> None:
        async def op(db: aiosqlite.Connection) -> None:
            await db.execute(
                "UPDATE attempts SET pid=?, pid_start=? WHERE job_id=? AND n=?",
                (a.pid, a.pid_start, a.job_id, a.n),
            )

        await self.write(op)

    async def add_event(self, job_id: int | None, at: str, event: Event) -> None:
        async def op(db: aiosqlite.Connection) -> None:
            await _insert_event(db, job_id, at, event)

        await self.write(op)

    async def record_hang(self, row: dict[str, Any]) -> None:
        async def op(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO hangs (job_id, attempt, gpu, pci_bus_id, driver_version, at, "
                "evidence, host_mem_available_mb, swap_used_mb, vram_used_mb, labels) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.get("job"),
                    row.get("attempt"),
                    row.get("gpu"),
                    row.get("pci_bus_id"),
                    row.get("driver_version"),
                    row["at"],
                    json.dumps(row.get("evidence")),
                    row.get("host_mem_available_mb"),
                    row.get("swap_used_mb"),
                    row.get("vram_used_mb"),
                    json.dumps(row.get("labels") or {}),
                ),
            )

        await self.write(op)

    async def add_daemon_event(self, at: str, kind: str, data: dict[str, Any]) -> None:
        async def op(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO daemon_events (at, kind, data) VALUES (?, ?, ?)",
                (at, kind, json.dumps(data)),
            )

        await self.write(op)

    # ---- reads ----------------------------------------------------------------------

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        async with self.db.execute(sql, tuple(params)) as cur:
            return list(await cur.fetchall())

    async def active_jobs(self) -> list[Job]:
        rows = await self._all(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('queued', 'running') ORDER BY id"
        )
        specs = _Specs()
        return [_row_to_job(r, specs) for r in rows]

    async def get_job(self, job_id: int) -> Job | None:
        rows = await self._all(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,))
        return _row_to_job(rows[0]) if rows else None

    async def list_jobs(
        self, states: Sequence[str], limit: int, before_id: int | None
    ) -> list[Job]:
        where: list[str] = []
        params: list[Any] = []
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

    async def queued_count(self, uid: int) -> int:
        rows = await self._all(
            "SELECT COUNT(*) FROM jobs WHERE owner_uid=? AND state IN ('queued','running')",
            (uid,),
        )
        return int(rows[0][0])

    async def hangs(self, limit: int = 1000) -> list[dict[str, Any]]:
        rows = await self._all(
            "SELECT job_id, attempt, gpu, pci_bus_id, driver_version, at, evidence, "
            "host_mem_available_mb, swap_used_mb, vram_used_mb, labels FROM hangs "
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
