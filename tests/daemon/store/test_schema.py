"""The schema's row mapping (a spec and a job survive the trip through their rows) and
its migrations: a database of the first schema, with rows, is brought to the current
one by opening it, and one newer than this gpusvd is refused."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.records import Attempt
from supervisor.daemon.store.database import Store, StoreOpenError
from supervisor.daemon.store.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    _job_params,
    _row_to_job,
    _spec_json,
    _Specs,
)

FULL = JobSpec(
    argv=("python", "t.py"), cwd="/w", env={"E": "1"}, owner_uid=7, owner_gid=8, name="n",
    labels={"a": "b"}, gpus=2, vram_mb=10, mem_mb=20, mem_key="k", mem_scale=1.5, retries=1,
    gpu_hang_retries=2, progress_timeout_s=3.0, progress_regex="r", priority=-1, after=(3, 4),
    time_limit_s=5.0, stall_timeout_s=6.0, share=True, array_id=9, array_index=1,
    max_running=2,
)  # fmt: skip


def test_a_spec_goes_out_without_its_env_and_comes_back_whole() -> None:
    text = _spec_json(FULL)
    data = json.loads(text)
    assert "env" not in data and data["argv"] == ["python", "t.py"] and data["after"] == [3, 4]
    assert _Specs().get(text, '{"E": "1"}') == FULL


def test_a_spec_of_an_older_row_without_after_reads_as_none() -> None:
    text = json.dumps({"argv": ["x"], "cwd": "/", "owner_uid": 1, "owner_gid": 1})
    assert _Specs().get(text, "{}") == JobSpec(("x",), "/", {}, 1, 1)


def test_one_read_parses_a_shared_spec_and_env_once() -> None:
    specs = _Specs()
    a, b = specs.get(_spec_json(FULL), '{"E": "1"}'), specs.get(_spec_json(FULL), '{"E": "1"}')
    assert a is b
    other = specs.get(_spec_json(JobSpec(("y",), "/", {}, 1, 1)), '{"E": "1"}')
    assert other.env is a.env


def test_a_job_survives_its_row() -> None:
    job = Job(
        5, FULL, JobState.FAILED, "s", "b", "e", "why", "hold", FailureReason.GPU_HANG, 3, 1, 2,
        (0, 1), 4, 12.5, "frame 9", True,
    )  # fmt: skip
    params = _job_params(job)
    assert params == (
        "failed",
        "b",
        "e",
        "why",
        "hold",
        "gpu_hang",
        3,
        1,
        2,
        "[0, 1]",
        4,
        12.5,
        "frame 9",
        1,
        5,
    )  # fmt: skip: UPDATE_JOB's order, the id last
    row = (5, _spec_json(FULL), '{"E": "1"}', "failed", "s", *params[1:-1])
    assert _row_to_job(row) == job


def first_schema_database(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(MIGRATIONS[1])
    db.execute("PRAGMA user_version=1")
    db.execute(
        "INSERT INTO jobs (id, spec, env, owner_uid, mem_key, priority, state, submitted_at) "
        "VALUES (4, ?, '{}', 7, 'k', 0, 'succeeded', 't0')",
        (json.dumps({"argv": ["x"], "cwd": "/", "owner_uid": 7, "owner_gid": 7}),),
    )
    db.execute(
        "INSERT INTO attempts (job_id, n, gpus, started_at, ended_at, mem_key, peak_rss_mb) "
        "VALUES (4, 1, '[0]', 't0', 't1', 'k', 100)"
    )
    db.execute("INSERT INTO hangs (job_id, at) VALUES (4, 't1')")
    db.close()


async def test_a_first_schema_database_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "gpusv.db"
    first_schema_database(path)
    store = await Store.open(path)
    try:
        assert await store._all("PRAGMA user_version") == [(SCHEMA_VERSION,)]
        job = await store.get_job(4)
        assert job is not None and job.held is False and job.state is JobState.SUCCEEDED
        assert job.spec.env == {}  # its own `env`, from before the table of environments
        assert await store._all("SELECT cleaned_at FROM jobs") == [(None,)]
        assert await store.attempts(4) == [
            Attempt(4, 1, (0,), "t0", "k", ended_at="t1", peak_rss_mb=100)
        ]
        [hang] = await store.hangs()
        assert (hang["job"], hang["name"], hang["frame"]) == (4, None, None)
    finally:
        await store.close()
    again = await Store.open(path)  # a second open migrates nothing
    await again.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpusv.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreOpenError) as refused:
        await Store.open(path)
    assert str(refused.value) == (
        f"the state database has schema {SCHEMA_VERSION + 1}, newer than this gpusvd's "
        f"({SCHEMA_VERSION}): run a newer gpusvd, or restore an older database"
    )
