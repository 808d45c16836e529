"""`list`'s filters and `clean`'s choice, on a real SQLite file holding jobs of two
owners in every state, an array, and a cleaned job."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.commands import InsertJob, MarkCleaned, SaveJob
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.daemon.store.commit import commit
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.job_queries import cleanable, list_jobs

EPOCH = 1767322800.0  # 2026-01-02T03:00:00.000Z
T0 = "2026-01-02T02:00:00.000Z"
EARLY = "2026-01-02T02:30:00.000Z"
AT = "2026-01-02T03:00:00.000Z"  # EPOCH itself
LATE = "2026-01-02T03:30:00.000Z"

Q, R, S, F, C = (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED,
                 JobState.CANCELLED)  # fmt: skip

# id: (owner, state, ended_at, array_id)
JOBS: dict[int, tuple[int, JobState, str | None, int | None]] = {
    1: (1000, S, EARLY, None),
    2: (1000, F, AT, None),
    3: (1001, C, LATE, None),
    4: (1000, Q, None, None),
    5: (1001, R, None, None),
    6: (1000, S, EARLY, 6),
    7: (1000, Q, None, 6),
    8: (1001, S, EARLY, None),  # cleaned below
}


@pytest.fixture
async def jobs(store: Store) -> Store:
    def spec(owner: int, array: int | None) -> JobSpec:
        return JobSpec(("true",), "/", {}, owner, owner, array_id=array)

    rows = {
        i: Job(i, spec(owner, array), state, T0, ended_at=ended)
        for i, (owner, state, ended, array) in JOBS.items()
    }
    await commit(store, [InsertJob(Job(i, j.spec, submitted_at=T0)) for i, j in rows.items()])
    await commit(store, [SaveJob(j, T0) for j in rows.values()])
    await commit(store, [MarkCleaned((8,), LATE)])
    return store


async def ids(store: Store, *states: str, limit: int = 100, **kw: Any) -> list[int]:
    return [j.id for j in await list_jobs(store, states, limit, kw.pop("before_id", None), **kw)]


async def test_newest_first_cleaned_never(jobs: Store) -> None:
    assert await ids(jobs) == [7, 6, 5, 4, 3, 2, 1]
    assert await ids(jobs, limit=2) == [7, 6]
    assert await ids(jobs, before_id=5) == [4, 3, 2, 1]


async def test_each_filter_alone_and_together(jobs: Store) -> None:
    assert await ids(jobs, "queued", "running") == [7, 5, 4]
    assert await ids(jobs, "succeeded") == [6, 1]
    assert await ids(jobs, owner_uid=1001) == [5, 3]
    assert await ids(jobs, array=6) == [7, 6]
    assert await ids(jobs, "succeeded", owner_uid=1000, before_id=6) == [1]


async def test_ended_since_keeps_active_jobs_and_recent_ends(jobs: Store) -> None:
    assert await ids(jobs, ended_since=EPOCH) == [7, 5, 4, 3, 2]  # ended at EPOCH counts
    assert await ids(jobs, ended_since=EPOCH + 0.001) == [7, 5, 4, 3]


async def test_the_rows_come_back_whole(jobs: Store) -> None:
    [job] = await list_jobs(jobs, (), 1, 4)  # before 4: job 3
    assert (job.id, job.state, job.ended_at, job.spec.owner_uid) == (3, C, LATE, 1001)


async def test_cleanable_is_finished_ended_by_then_and_not_cleaned(jobs: Store) -> None:
    assert sorted(await cleanable(jobs, None, EPOCH)) == [1, 2, 6]
    assert sorted(await cleanable(jobs, None, EPOCH - 0.001)) == [1, 6]
    assert sorted(await cleanable(jobs, 1001, EPOCH + 3600)) == [3]
    assert sorted(await cleanable(jobs, 1000, EPOCH + 3600)) == [1, 2, 6]


async def test_by_name_glob_and_by_every_label(store: Store) -> None:
    named = {
        1: ("enc-a", {"kind": "enc", "codec": "av1"}),
        2: ("enc-b", {"kind": "enc"}),
        3: ("train", {"kind": "train", "odd key.x/y": "it's"}),
        4: ("", {}),
    }
    specs = {
        i: JobSpec(("true",), "/", {}, 1000, 1000, name=name, labels=labels)
        for i, (name, labels) in named.items()
    }
    await commit(store, [InsertJob(Job(i, spec, submitted_at=T0)) for i, spec in specs.items()])
    assert await ids(store, name="enc-*") == [2, 1]
    assert await ids(store, name="enc-?") == [2, 1]
    assert await ids(store, name="ENC-*") == []  # case-sensitive, as a shell matches
    assert await ids(store, name="t[a-r]ain") == [3]
    assert await ids(store, name="*") == [4, 3, 2, 1]
    assert await ids(store, labels=[("kind", "enc")]) == [2, 1]
    assert await ids(store, labels=[("kind", "enc"), ("codec", "av1")]) == [1]
    assert await ids(store, labels=[("odd key.x/y", "it's")]) == [3]  # a key, not a path
    assert await ids(store, labels=[("kind", "en")]) == []
    assert await ids(store, name="enc-*", labels=[("codec", "av1")]) == [1]
