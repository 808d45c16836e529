"""The store's schema and migrations, its records, and how they map to rows.

Part of the persistence layer with store.py (the writer and the queries): together they
hold all the SQL in the project.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.records import Attempt, Event
from supervisor.wire import jsonline

SCHEMA_VERSION = 6

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
    # The cards' UUIDs beside their indices: an index is only the daemon's number.
    2: "ALTER TABLE attempts ADD COLUMN gpu_uuids TEXT",
    # A hang record names its job and the frame it had reached (its last progress match).
    3: """
    ALTER TABLE hangs ADD COLUMN name TEXT;
    ALTER TABLE hangs ADD COLUMN frame TEXT
    """,
    # `gpusv hold`, and `gpusv clean`: a cleaned job leaves every listing, but its
    # attempts stay (memory history) and so does its row, which they reference.
    4: """
    ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN cleaned_at TEXT;
    """,
    # A stop (cancel, --time, a hang, a drain) is an intent committed before it is acted
    # on: the next daemon carries it through a restart.
    5: """
    ALTER TABLE attempts ADD COLUMN stop_reason TEXT;
    ALTER TABLE attempts ADD COLUMN stop_at TEXT;
    ALTER TABLE attempts ADD COLUMN stop_evidence TEXT;
    """,
    # A job's environment stored once for all the jobs that share it (a batch, a
    # session's submits): a job's row was three quarters its environment, and each
    # change of a job (its hold, its claim, its end) wrote that page again. Rows made
    # before keep their own `env` (env_id NULL); a row made since has env ''.
    6: """
    CREATE TABLE envs (
        id INTEGER PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        text TEXT NOT NULL
    );
    ALTER TABLE jobs ADD COLUMN env_id INTEGER REFERENCES envs(id);
    """,
}


@dataclass(frozen=True)
class MemRow:
    peak_rss_mb: int
    reason: str | None
    scale: float | None
    peak_vram_mb: int | None


# ---- row mapping ------------------------------------------------------------------------

# A job's environment as its row has it: in `envs` since version 6, in its own `env` before.
ENV_TEXT = "coalesce((SELECT text FROM envs WHERE envs.id = jobs.env_id), jobs.env)"
JOB_COLUMNS = (
    f"id, spec, {ENV_TEXT}, state, submitted_at, started_at, ended_at, waiting_for, hold_reason, "
    "reason, exit_code, ordinary_used, gpu_hang_used, gpus, attempts, not_before, progress, held"
)


def _spec_json(spec: JobSpec) -> str:
    # Shallow: a spec holds only plain values, and asdict's deep copy is slow for a batch;
    # its __dict__ holds the fields in their order (14 us a job where fields() took 21).
    values = dict(vars(spec))
    del values["env"]  # stored apart, once for the jobs that share it (`envs`)
    return jsonline.dumps(values)


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
            if data.get("cards") is not None:
                data["cards"] = tuple(data["cards"])
            data["after_any"] = tuple(data.get("after_any", ()))  # absent in older rows
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
        held=bool(row[17]),
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
        gpu_uuids=tuple(json.loads(row[15])) if row[15] else (),
        stop_reason=row[16],
        stop_at=row[17],
        stop_evidence=json.loads(row[18]) if row[18] else None,
    )


_INSERTED_ATTEMPT_COLUMNS = (
    "job_id, n, gpus, pid, pid_start, started_at, ended_at, exit_code, signal, reason, "
    "peak_rss_mb, peak_vram_mb, evidence, mem_key, mem_scale, gpu_uuids"
)
ATTEMPT_COLUMNS = f"{_INSERTED_ATTEMPT_COLUMNS}, stop_reason, stop_at, stop_evidence"
RECORD_STOP = "UPDATE attempts SET stop_reason=?, stop_at=?, stop_evidence=? WHERE job_id=? AND n=?"


UPDATE_JOB = (
    "UPDATE jobs SET state=?, started_at=?, ended_at=?, waiting_for=?, hold_reason=?, "
    "reason=?, exit_code=?, ordinary_used=?, gpu_hang_used=?, gpus=?, attempts=?, "
    "not_before=?, progress=?, held=? WHERE id=?"
)
INSERT_EVENT = "INSERT INTO events (job_id, at, kind, message, data) VALUES (?, ?, ?, ?, ?)"


def _update_job(db: sqlite3.Connection, job: Job) -> None:
    db.execute(UPDATE_JOB, _job_params(job))


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
        jsonline.dumps(list(job.gpus)),
        job.attempts,
        job.not_before,
        job.progress,
        int(job.held),
        job.id,
    )


def _event_params(job_id: int | None, at: str, ev: Event) -> tuple[Any, ...]:
    return (job_id, at, ev.kind, ev.message, jsonline.dumps(ev.data) if ev.data else None)


def _insert_event(db: sqlite3.Connection, job_id: int | None, at: str, ev: Event) -> None:
    db.execute(INSERT_EVENT, _event_params(job_id, at, ev))


def _insert_attempt(db: sqlite3.Connection, a: Attempt) -> None:
    db.execute(
        f"INSERT INTO attempts ({_INSERTED_ATTEMPT_COLUMNS}) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            a.job_id,
            a.n,
            jsonline.dumps(list(a.gpus)),
            a.pid,
            a.pid_start,
            a.started_at,
            a.ended_at,
            a.exit_code,
            a.signal,
            a.reason,
            a.peak_rss_mb,
            a.peak_vram_mb,
            jsonline.dumps(a.evidence) if a.evidence else None,
            a.mem_key,
            a.mem_scale,
            jsonline.dumps(list(a.gpu_uuids)),
        ),
    )


FINISH_ATTEMPT = (
    "UPDATE attempts SET pid=coalesce(?, pid), pid_start=coalesce(?, pid_start), "
    "started_at=?, ended_at=?, exit_code=?, signal=?, reason=?, peak_rss_mb=?, "
    "peak_vram_mb=?, evidence=? WHERE job_id=? AND n=?"
)


def _finish_attempt(db: sqlite3.Connection, a: Attempt) -> None:
    """An attempt's end, with its pid and start as the engine holds them: the end of a
    short job carries the pid that had not been recorded yet."""
    db.execute(
        FINISH_ATTEMPT,
        (
            a.pid,
            a.pid_start,
            a.started_at,
            a.ended_at,
            a.exit_code,
            a.signal,
            a.reason,
            a.peak_rss_mb,
            a.peak_vram_mb,
            jsonline.dumps(a.evidence) if a.evidence else None,
            a.job_id,
            a.n,
        ),
    )
