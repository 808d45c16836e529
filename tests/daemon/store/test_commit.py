"""The engine's commit on a real SQLite file: each kind of write lands as the rows it
stands for, all of one call in one transaction (a write that fails leaves nothing of the
others), and the next id never goes back."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from supervisor.core.commands import (
    CloseAttempt,
    InsertJob,
    MarkCleaned,
    RecordHang,
    SaveJob,
    SaveSpec,
    SetPid,
    Write,
)
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.records import Attempt, Event
from supervisor.daemon.store.commit import commit, commit_later, next_job_id
from supervisor.daemon.store.database import StorageError, Store
from supervisor.daemon.store.schema import ENV_TEXT

T0 = "2026-01-02T03:04:05.000Z"
T1 = "2026-01-02T03:04:06.000Z"
T2 = "2026-01-02T03:04:07.000Z"


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "argv": ("python", "train.py"),
        "cwd": "/work",
        "env": {"A": "1"},
        "owner_uid": 1000,
        "owner_gid": 1000,
    }
    return JobSpec(**(base | kw))


def job(job_id: int, **kw: Any) -> Job:
    return Job(job_id, kw.pop("spec", spec()), submitted_at=T0, **kw)


async def rows(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await store.db.execute_fetchall(sql, params)]


async def test_an_inserted_job_is_a_queued_row_with_its_submitted_event(store: Store) -> None:
    s = spec(env={"B": "2"}, mem_key="train", priority=5, owner_uid=1001)
    await commit(store, [InsertJob(job(1, spec=s))])
    assert await rows(
        store,
        f"SELECT id, {ENV_TEXT}, owner_uid, mem_key, priority, state, submitted_at FROM jobs",
    ) == [(1, '{"B": "2"}', 1001, "train", 5, "queued", T0)]
    spec_json = json.loads((await rows(store, "SELECT spec FROM jobs"))[0][0])
    assert spec_json["argv"] == ["python", "train.py"] and "env" not in spec_json
    assert await rows(store, "SELECT job_id, at, kind, message, data FROM events") == [
        (1, T0, "submitted", "submitted", None)
    ]
    got = await store.get_job(1)
    assert got is not None and got.spec == s and got.state is JobState.QUEUED


async def test_an_updated_spec_lands_with_its_priority_and_pinned_cards(store: Store) -> None:
    await commit(store, [InsertJob(job(1))])
    s = spec(priority=7, time_limit_s=60.0, cards=(0, 2))
    await commit(store, [SaveSpec(job(1, spec=s))])
    assert await rows(store, "SELECT priority FROM jobs") == [(7,)]
    got = await store.get_job(1)
    assert got is not None and got.spec == s and got.spec.cards == (0, 2)
    (active,) = await store.active_jobs()
    assert active.spec == s


async def test_a_batch_shares_its_env_and_keeps_its_request_id(store: Store) -> None:
    env = {"SHARED": "yes"}
    writes: list[Write] = [InsertJob(job(i, spec=spec(env=env))) for i in (4, 5, 6)]
    await commit(store, writes, "req-1")
    assert await rows(store, f"SELECT id, {ENV_TEXT} FROM jobs ORDER BY id") == [
        (4, '{"SHARED": "yes"}'),
        (5, '{"SHARED": "yes"}'),
        (6, '{"SHARED": "yes"}'),
    ]
    assert await rows(store, "SELECT * FROM submit_requests") == [(1000, "req-1", 4, 3)]
    assert await store.request_ids(1000, "req-1") == [4, 5, 6]
    assert store.ids is not None and store.ids.value == 6
    # Stored once, and found again by a later submit of the same environment.
    await commit(store, [InsertJob(job(7, spec=spec(env={"SHARED": "yes"})))])
    assert await rows(store, "SELECT id, text FROM envs") == [(1, '{"SHARED": "yes"}')]
    assert await rows(store, "SELECT DISTINCT env, env_id FROM jobs") == [("", 1)]
    got = await store.get_job(7)
    assert got is not None and got.spec.env == env


async def test_no_request_id_no_request_row(store: Store) -> None:
    await commit(store, [InsertJob(job(1))])
    assert await rows(store, "SELECT * FROM submit_requests") == []


async def test_a_saved_job_opens_and_closes_its_attempt_with_its_events(store: Store) -> None:
    await commit(store, [InsertJob(job(1))])
    opened = Attempt(1, 1, (0, 2), T1, "key", 1.5, gpu_uuids=("GPU-a", "GPU-b"))
    running = job(1, state=JobState.RUNNING, started_at=T1, gpus=(0, 2), attempts=1)
    started = Event("started", "on cards 0,2", {"gpus": [0, 2]})
    await commit(store, [SaveJob(running, T1, (started,), new_attempt=opened)])
    assert await rows(store, "SELECT state, started_at, gpus, attempts FROM jobs") == [
        ("running", T1, "[0, 2]", 1)
    ]
    assert await store.open_attempts() == [opened]

    closed = Attempt(
        1, 1, (0, 2), T1, "key", 1.5, None, None, T2, 3, None, "exit_nonzero", 700, 40,
        {"why": "x"}, ("GPU-a", "GPU-b"),
    )  # fmt: skip
    failed = job(
        1, state=JobState.FAILED, started_at=T1, ended_at=T2, reason=FailureReason.EXIT_NONZERO,
        exit_code=3, ordinary_used=1, gpus=(0, 2), attempts=1, not_before=12.5,
        progress="step 9", held=True,
    )  # fmt: skip
    await commit(store, [SaveJob(failed, T2, (Event("failed", "exit 3"),), ended_attempt=closed)])
    assert await store.attempts(1) == [closed]
    assert await store.open_attempts() == []
    assert await store.get_job(1) == failed
    assert await rows(store, "SELECT job_id, at, kind, message, data FROM events ORDER BY id") == [
        (1, T0, "submitted", "submitted", None),
        (1, T1, "started", "on cards 0,2", '{"gpus": [0, 2]}'),
        (1, T2, "failed", "exit 3", None),
    ]


async def test_a_pid_is_set_and_the_job_start_only_when_given(store: Store) -> None:
    a = Attempt(1, 1, (0,), T0, "key")
    b = Attempt(2, 1, (1,), T0, "key")
    await commit(store, [InsertJob(job(1)), InsertJob(job(2))])
    await commit(store, [SaveJob(job(i), T0, new_attempt=x) for i, x in ((1, a), (2, b))])
    await commit(
        store,
        [
            SetPid(Attempt(1, 1, (0,), T1, "key", pid=4242, pid_start=17.25), job_started_at=T1),
            SetPid(Attempt(2, 1, (1,), T2, "key", pid=4343, pid_start=18.5)),
        ],
    )
    assert await rows(
        store, "SELECT job_id, pid, pid_start, started_at FROM attempts ORDER BY job_id"
    ) == [(1, 4242, 17.25, T1), (2, 4343, 18.5, T2)]
    assert await rows(store, "SELECT id, started_at FROM jobs ORDER BY id") == [
        (1, T1),
        (2, None),
    ]


async def test_a_hang_record_lands_whole(store: Store) -> None:
    row = {
        "job": 7, "attempt": 2, "gpu": 1, "pci_bus_id": "0000:3b:00.0",
        "driver_version": "550.54", "at": T1, "evidence": {"xid": 79},
        "host_mem_available_mb": 9000, "swap_used_mb": 12, "vram_used_mb": 40000,
        "labels": {"team": "vision"}, "name": "train", "frame": "epoch 3",
    }  # fmt: skip
    await commit(store, [RecordHang(row), RecordHang({"at": T2})])
    assert await store.hangs() == [
        row,
        {
            "job": None, "attempt": None, "gpu": None, "pci_bus_id": None,
            "driver_version": None, "at": T2, "evidence": None, "host_mem_available_mb": None,
            "swap_used_mb": None, "vram_used_mb": None, "labels": {}, "name": None,
            "frame": None,
        },
    ]  # fmt: skip


async def test_an_orphan_attempt_is_closed_without_touching_its_job(store: Store) -> None:
    await commit(store, [InsertJob(job(1))])
    await commit(store, [SaveJob(job(1), T0, new_attempt=Attempt(1, 1, (0,), T0, "key"))])
    closed = Attempt(1, 1, (0,), T0, "key", ended_at=T2, reason="interrupted")
    await commit(store, [CloseAttempt(closed)])
    assert await store.attempts(1) == [closed]
    assert await rows(store, "SELECT state FROM jobs") == [("queued",)]


async def test_cleaned_marks_once_and_only_the_ids_named(store: Store) -> None:
    await commit(store, [InsertJob(job(i)) for i in (1, 2, 3)])
    await commit(store, [MarkCleaned((1, 2), T1)])
    await commit(store, [MarkCleaned((2, 3), T2)])
    assert await rows(store, "SELECT id, cleaned_at FROM jobs ORDER BY id") == [
        (1, T1),
        (2, T1),
        (3, T2),
    ]


async def test_a_failing_write_leaves_nothing_of_its_transaction(store: Store) -> None:
    await commit(store, [InsertJob(job(1))])
    writes: list[Write] = [
        InsertJob(job(2)),
        MarkCleaned((1,), T1),
        RecordHang({"at": T1}),
        # An attempt of a job that does not exist: the foreign key refuses it.
        SaveJob(job(9), T1, (Event("x", "y"),), new_attempt=Attempt(9, 1, (0,), T1, "k")),
    ]
    with pytest.raises(sqlite3.IntegrityError):
        await commit(store, writes, "req-2")
    assert await rows(store, "SELECT id, cleaned_at FROM jobs") == [(1, None)]
    assert await rows(store, "SELECT count(*) FROM events") == [(1,)]
    assert await rows(store, "SELECT count(*) FROM hangs") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM submit_requests") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM attempts") == [(0,)]
    assert store.problem is None  # a bad statement, not a bad disk
    # The id mark was raised before the commit failed: id 2 is never handed out again.
    assert await next_job_id(store) == 3


async def test_a_write_the_disk_refuses_raises_storage_error(store: Store) -> None:
    await store.db.execute("PRAGMA query_only=ON")  # every write now fails as read-only
    try:
        with pytest.raises(StorageError) as refused:
            await commit(store, [InsertJob(job(1))])
        assert refused.value.reason == "read-only"
    finally:
        await store.db.execute("PRAGMA query_only=OFF")
    assert await rows(store, "SELECT count(*) FROM jobs") == [(0,)]


async def test_a_pid_committed_later_lands_with_the_next_settle(store: Store) -> None:
    await commit(store, [InsertJob(job(1))])
    await commit(store, [SaveJob(job(1), T0, new_attempt=Attempt(1, 1, (0,), T0, "key"))])
    commit_later(store, [SetPid(Attempt(1, 1, (0,), T1, "key", pid=99, pid_start=1.0))])
    assert await rows(store, "SELECT pid FROM attempts") == [(None,)]  # not yet
    await store.settle()
    assert await rows(store, "SELECT pid, started_at FROM attempts") == [(99, T1)]


async def test_next_id_is_past_the_rows_the_sequence_and_the_mark(store: Store) -> None:
    assert await next_job_id(store) == 1
    await commit(store, [InsertJob(job(3))])
    assert await next_job_id(store) == 4
    await store.db.execute("DELETE FROM events")
    await store.db.execute("DELETE FROM jobs")  # a deleted job's id stays handed out
    assert await next_job_id(store) == 4
    assert store.ids is not None
    store.ids.raise_to(10)  # a lost tail of the database that the mark remembers
    assert await next_job_id(store) == 11


async def test_each_job_of_a_batch_keeps_its_own_env(store: Store) -> None:
    shared = {"S": "1"}
    writes: list[Write] = [
        InsertJob(job(1, spec=spec(env=shared))),
        InsertJob(job(2, spec=spec(env={"OTHER": "2"}))),
        InsertJob(job(3, spec=spec(env=shared))),
    ]
    await commit(store, writes)
    assert await rows(store, f"SELECT id, {ENV_TEXT} FROM jobs ORDER BY id") == [
        (1, '{"S": "1"}'),
        (2, '{"OTHER": "2"}'),
        (3, '{"S": "1"}'),
    ]
    assert await rows(store, "SELECT count(*) FROM envs") == [(2,)]


async def test_without_the_mark_ids_follow_the_database_s_sequence(store: Store) -> None:
    mark, store.ids = store.ids, None  # a store opened on a database alone
    try:
        assert await next_job_id(store) == 1
        await commit(store, [InsertJob(job(5))])
        await store.db.execute("DELETE FROM events")
        await store.db.execute("DELETE FROM jobs")
        assert await next_job_id(store) == 6  # the sequence remembers the deleted job
    finally:
        store.ids = mark


async def test_an_inserted_jobs_notes_follow_its_submitted_event(store: Store) -> None:
    note = Event("mem_over_limit", "needs ~64 GiB", {"projected_mb": 65536})
    await commit(store, [InsertJob(job(1), notes=(note,))])
    assert await rows(store, "SELECT kind, message, data FROM events ORDER BY id") == [
        ("submitted", "submitted", None),
        ("mem_over_limit", "needs ~64 GiB", '{"projected_mb": 65536}'),
    ]
