"""A database of the earlier key rule: derived keys become today's, with their history;
a key of the user's own stays."""

from __future__ import annotations

import time
from dataclasses import replace

from supervisor.core.commands import CloseAttempt, InsertJob, SaveJob
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.memkey import mem_key
from supervisor.core.memkey_legacy import legacy_mem_key
from supervisor.core.records import Attempt
from supervisor.daemon.programs import program_finder
from supervisor.daemon.store.commit import commit
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.rekey import MARK, rekey
from tests import hung_fs

T0, T1 = "2026-01-02T03:04:05.000Z", "2026-01-02T03:04:06.000Z"
PATH = "/usr/bin:/bin"


def encode(name: str, key: str | None = None) -> JobSpec:
    argv = ("ffmpeg", "-i", f"in/{name}.mp4", f"out/{name}.mkv")
    return JobSpec(argv, "/work", {"PATH": PATH}, 1000, 1000, mem_key=key or legacy_mem_key(argv))


async def ran(store: Store, job_id: int, spec: JobSpec, peak_mb: int) -> None:
    job = Job(job_id, spec, submitted_at=T0)
    attempt = Attempt(job_id, 1, (), T0, spec.mem_key)
    await commit(store, [InsertJob(job)])
    await commit(store, [SaveJob(replace(job, state=JobState.RUNNING), T0, new_attempt=attempt)])
    ended = replace(attempt, ended_at=T1, exit_code=0, peak_rss_mb=peak_mb)
    await commit(store, [CloseAttempt(ended)])


async def test_derived_keys_and_their_history_move_to_todays_key(store: Store) -> None:
    # Under the earlier rule each input file was a kind of its own.
    await ran(store, 1, encode("a"), 700)
    await ran(store, 2, encode("b"), 727)
    await ran(store, 3, encode("c", key="encode-4k"), 900)
    assert encode("a").mem_key != encode("b").mem_key
    await store.db.execute("DELETE FROM store_marks")
    await store.db.commit()

    assert await rekey(store.db) == 2
    today = mem_key(encode("a").argv, cwd="/work", which=program_finder(PATH))
    assert [r.peak_rss_mb for r in await store.mem_history(today)] == [700, 727]
    for job_id in (1, 2):
        job = await store.get_job(job_id)
        assert job is not None and job.spec.mem_key == today
    kept = await store.get_job(3)
    assert kept is not None and kept.spec.mem_key == "encode-4k"
    assert [r.peak_rss_mb for r in await store.mem_history("encode-4k")] == [900]

    assert await rekey(store.db) == 0  # once per database
    rows = await store.db.execute_fetchall("SELECT name FROM store_marks")
    assert [tuple(r) for r in rows] == [(MARK,)]


async def test_a_fresh_database_is_marked_at_open(store: Store) -> None:
    rows = await store.db.execute_fetchall("SELECT name FROM store_marks")
    assert [tuple(r) for r in rows] == [(MARK,)]


async def test_a_path_that_does_not_answer_holds_the_rekey_only_until_its_deadline(
    store: Store, hung: hung_fs.Hung
) -> None:
    """Found before the deadline: keyed with it; past it, a program is taken as missing."""
    argv = ("sh", "run.sh")
    far = f"{hung.path}/bin:{PATH}"
    near_job = JobSpec(argv, "/work", {"PATH": PATH}, 1000, 1000, mem_key=legacy_mem_key(argv))
    far_job = replace(near_job, env={"PATH": far})
    await ran(store, 1, near_job, 100)
    await ran(store, 2, far_job, 200)
    await store.db.execute("DELETE FROM store_marks")
    await store.db.commit()

    began = time.monotonic()
    assert await rekey(store.db, deadline_s=0.5) == 2
    assert time.monotonic() - began < 5
    near = await store.get_job(1)
    assert near is not None
    assert near.spec.mem_key == mem_key(argv, cwd="/work", which=program_finder(PATH))
    stuck = await store.get_job(2)
    assert stuck is not None
    assert stuck.spec.mem_key == mem_key(argv, cwd="/work", which=lambda name: None)
    rows = await store.db.execute_fetchall("SELECT name FROM store_marks")
    assert [tuple(r) for r in rows] == [(MARK,)]
