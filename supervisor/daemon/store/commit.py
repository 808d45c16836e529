"""The engine's writes, committed as one transaction through the store's writer."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.core.commands import (
    CloseAttempt,
    DropAttempt,
    InsertJob,
    MarkCleaned,
    RecordHang,
    RecordStop,
    SaveJob,
    SaveSpec,
    SetPid,
    Write,
)
from supervisor.core.records import Event
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.schema import (
    INSERT_EVENT,
    RECORD_STOP,
    UPDATE_JOB,
    _event_params,
    _finish_attempt,
    _insert_attempt,
    _job_params,
    _spec_json,
)
from supervisor.wire import jsonline

SUBMITTED = Event("submitted", "submitted")

INSERT_JOB = (
    "INSERT INTO jobs (id, spec, env, env_id, owner_uid, mem_key, priority, state, "
    "submitted_at) VALUES (?, ?, '', ?, ?, ?, ?, 'queued', ?)"
)
INSERT_ENV = "INSERT OR IGNORE INTO envs (hash, text) VALUES (?, ?)"
INSERT_HANG = (
    "INSERT INTO hangs (job_id, attempt, gpu, pci_bus_id, driver_version, at, evidence, "
    "host_mem_available_mb, swap_used_mb, vram_used_mb, labels, name, frame) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


async def next_job_id(store: Store) -> int:
    """One past the highest id ever handed out: deleted jobs, and ids the database lost
    but the id mark kept, included (the store raised its sequence past them at open)."""
    async with store.db.execute(
        "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name='jobs'), 0), "
        "coalesce((SELECT max(id) FROM jobs), 0))"
    ) as cur:
        row = await cur.fetchone()
    mark = store.ids.value if store.ids is not None else 0
    return max(int(row[0] if row else 0), mark) + 1


INSERT_REQUEST = (
    "INSERT INTO submit_requests (owner_uid, request_id, first_id, count) VALUES (?, ?, ?, ?)"
)


def _request_params(inserts: Sequence[InsertJob], request_id: str) -> tuple[Any, ...]:
    ids = [w.job.id for w in inserts]  # one submit's ids are consecutive
    return (inserts[0].job.spec.owner_uid, request_id, ids[0], len(ids))


def _hang_params(row: dict[str, Any]) -> tuple[Any, ...]:
    return (
        row.get("job"),
        row.get("attempt"),
        row.get("gpu"),
        row.get("pci_bus_id"),
        row.get("driver_version"),
        row["at"],
        jsonline.dumps(row.get("evidence")),
        row.get("host_mem_available_mb"),
        row.get("swap_used_mb"),
        row.get("vram_used_mb"),
        jsonline.dumps(row.get("labels") or {}),
        row.get("name"),
        row.get("frame"),
    )


async def commit(store: Store, writes: Sequence[Write], request_id: str | None = None) -> None:
    """Commit every write in one transaction; raises if it did not commit. A submit's
    `request_id` is kept with the jobs it inserts, in the same transaction."""
    await store.write(transaction(store, writes, request_id))


def commit_later(store: Store, writes: Sequence[Write]) -> None:
    """Queue writes for the next group commit without waiting for it: only for what
    another durable record already holds (a pid is in its keeper's journal)."""
    store.write_later(transaction(store, writes, None))


def transaction(
    store: Store, writes: Sequence[Write], request_id: str | None
) -> Callable[[sqlite3.Connection], None]:
    """The writes as one op for the store's writer (run on the connection's thread)."""
    envs: dict[int, int] = {}  # a batch shares one env: stored (or found) once

    def env_id(db: sqlite3.Connection, env: dict[str, str]) -> int:
        found = envs.get(id(env))  # the writes hold their specs: an id is not reused
        if found is None:
            text = jsonline.dumps(env)
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            db.execute(INSERT_ENV, (digest, text))
            row = db.execute("SELECT id FROM envs WHERE hash = ?", (digest,)).fetchone()
            found = envs[id(env)] = int(row[0])
        return found

    def job_row(db: sqlite3.Connection, w: InsertJob) -> tuple[Any, ...]:
        spec = w.job.spec
        owner, key, prio, at = spec.owner_uid, spec.mem_key, spec.priority, w.job.submitted_at
        return (w.job.id, _spec_json(spec), env_id(db, spec.env), owner, key, prio, at)

    inserts = [w for w in writes if isinstance(w, InsertJob)]
    saves = [w for w in writes if isinstance(w, SaveJob)]
    events = [
        _event_params(w.job.id, w.job.submitted_at, ev)
        for w in inserts
        for ev in (SUBMITTED, *w.notes)
    ] + [_event_params(w.job.id, w.at, ev) for w in saves for ev in w.events]

    def op(db: sqlite3.Connection) -> None:
        db.executemany(INSERT_JOB, [job_row(db, w) for w in inserts])
        if inserts and request_id is not None:
            db.execute(INSERT_REQUEST, _request_params(inserts, request_id))
        if inserts and store.ids is not None:  # before the commit: ids never go back
            store.ids.raise_to(max(w.job.id for w in inserts))
        for w in saves:
            if w.new_attempt is not None:
                _insert_attempt(db, w.new_attempt)
            if w.ended_attempt is not None:
                _finish_attempt(db, w.ended_attempt)
        db.executemany(UPDATE_JOB, [_job_params(w.job) for w in saves])
        db.executemany(INSERT_EVENT, events)
        for other in writes:
            if not isinstance(other, InsertJob | SaveJob):
                _one(db, other)

    return op


def _one(db: sqlite3.Connection, w: Write) -> None:
    """A write that is neither a job's insert nor its save."""
    match w:
        case SetPid(attempt=a):
            db.execute(
                "UPDATE attempts SET pid=?, pid_start=?, started_at=? WHERE job_id=? AND n=?",
                (a.pid, a.pid_start, a.started_at, a.job_id, a.n),
            )
            if w.job_started_at is not None:
                db.execute("UPDATE jobs SET started_at=? WHERE id=?", (w.job_started_at, a.job_id))
        case RecordHang():
            db.execute(INSERT_HANG, _hang_params(w.row))
        case CloseAttempt():
            _finish_attempt(db, w.attempt)
        case RecordStop():
            evidence = jsonline.dumps(w.evidence) if w.evidence else None
            db.execute(RECORD_STOP, (w.reason, w.at, evidence, w.job_id, w.n))
        case DropAttempt():
            db.execute(
                "DELETE FROM attempts WHERE job_id=? AND n=? AND pid IS NULL", (w.job_id, w.n)
            )
        case SaveSpec(job=job):
            db.execute(
                "UPDATE jobs SET spec=?, priority=? WHERE id=?",
                (_spec_json(job.spec), job.spec.priority, job.id),
            )
        case MarkCleaned():
            db.executemany(
                "UPDATE jobs SET cleaned_at = ? WHERE id = ? AND cleaned_at IS NULL",
                [(w.at, job_id) for job_id in w.ids],
            )
