"""Arrays in the pure parts: RANGE[%N] parsing, the engine naming a new array by its first
job in the one submit step, and admission's cap on how many of an array run at once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.client.arrays import array_options, parse_range, summaries
from supervisor.core import commands as c
from supervisor.core.admission import Candidate, Card, Hold, HostMemory, Plan, RunningJob, plan
from supervisor.core.engine import step
from supervisor.core.jobqueue import JobQueue, used_before
from supervisor.core.jobs import Job, JobSpec
from supervisor.core.table import Table
from supervisor.wire.sizes import ConfigError

GB = 1024
HOST = HostMemory(limit_mb=125 * GB, available_mb=120 * GB, reserve_mb=6 * GB)
NOW = c.Now(1_700_000_000.0, 500.0)


@pytest.mark.parametrize(
    ("text", "indices", "cap"),
    [
        ("0-3", [0, 1, 2, 3], None),
        ("0-99%8", list(range(100)), 8),
        ("1,3,5-9", [1, 3, 5, 6, 7, 8, 9], None),
        ("7", [7], None),
        ("2-2%1", [2], 1),
    ],
)
def test_ranges(text: str, indices: list[int], cap: int | None) -> None:
    assert parse_range(text) == (indices, cap)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is not an index"),
        ("5-3", "is empty"),
        ("1,,2", "is not an index"),
        ("a-b", "is not an index"),
        ("-3", "is not an index"),
        ("0-3%0", "at least 1"),
        ("0-3%", "whole number"),
        ("0-3%x", "whole number"),
        ("1,2,1", "appears twice"),
        ("0-100000", "more than"),
    ],
)
def test_bad_ranges_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_range(text)


def test_the_cap_comes_from_the_range_or_max_running_once() -> None:
    assert array_options("0-1", 3) == {"array": [0, 1], "max_running": 3}
    assert array_options("0-1%2", None) == {"array": [0, 1], "max_running": 2}
    assert array_options(None, 2) == {"max_running": 2}
    assert array_options(None, None) == {}
    with pytest.raises(ConfigError, match="once"):
        array_options("0-1%2", 3)
    with pytest.raises(ConfigError, match="at least 1"):
        array_options(None, 0)


def test_summaries_count_the_newest_job_of_each_index() -> None:
    jobs: list[dict[str, Any]] = [
        {"id": 1, "array_id": 1, "array_index": 0, "state": "succeeded"},
        {"id": 2, "array_id": 1, "array_index": 1, "state": "failed"},
        {"id": 3, "array_id": None, "array_index": None, "state": "running"},
        {"id": 4, "array_id": 1, "array_index": 1, "state": "running"},
    ]
    assert summaries(jobs) == ["array 1: 2 indices: 1 running, 1 succeeded"]


def spec(index: int | None, array: int | None = None) -> JobSpec:
    return JobSpec(("eval",), "/", {}, 1000, 1000, array_id=array, array_index=index)


def test_a_new_array_is_named_by_its_first_job_in_one_step() -> None:
    t = Table()
    t.next_id = 10
    out = step(t, c.SubmitJobs((spec(0), spec(1), spec(None))), NOW)
    inserted = [w.job for w in out.writes if isinstance(w, c.InsertJob)]
    assert [(j.id, j.spec.array_id, j.spec.array_index) for j in inserted] == [
        (10, 10, 0),
        (11, 10, 1),
        (12, None, None),
    ]


def test_a_restart_keeps_its_array() -> None:
    t = Table()
    t.next_id = 50
    out = step(t, c.SubmitJobs((spec(3, array=10),)), NOW)
    (job,) = [w.job for w in out.writes if isinstance(w, c.InsertJob)]
    assert (job.id, job.spec.array_id, job.spec.array_index) == (50, 10, 3)


def cand(job_id: int, array: int | None, cap: int | None) -> Candidate:
    return Candidate(job_id, 0, None, None, None, array=array, cap=cap)


def run(cands: list[Candidate], running: list[RunningJob], cpu: int = 16) -> Plan:
    return plan(
        cands,
        cards=[Card(0, 24 * GB, 0, True, ())],
        cpu_slots_free=cpu,
        host=HOST,
        running=running,
        now=0.0,
        max_backfill_wait_s=900.0,
    )


def test_the_cap_holds_the_rest_and_says_so() -> None:
    running = [RunningJob(1, None, 0, (), 0, array=1)]
    p = run([cand(i, 1, 2) for i in range(2, 6)] + [cand(9, None, None)], running)
    assert [s.job_id for s in p.starts] == [2, 9]
    assert p.holds[0] == Hold(3, "array", "waiting for array 1: at most 2 of its jobs run at once")
    assert {h.job_id for h in p.holds} == {3, 4, 5}


def test_arrays_are_capped_each_on_its_own() -> None:
    p = run([cand(1, 1, 1), cand(2, 1, 1), cand(3, 2, 1), cand(4, 2, 1)], [])
    assert [s.job_id for s in p.starts] == [1, 3]


@given(
    st.lists(st.tuples(st.sampled_from([None, 1, 2]), st.integers(1, 4)), max_size=20),
    st.lists(st.sampled_from([None, 1, 2]), max_size=6),
    st.integers(0, 20),
)
def test_never_more_than_the_cap(
    jobs: list[tuple[int | None, int]], running_arrays: list[int | None], cpu: int
) -> None:
    caps = {1: 3, 2: 2}
    running = [RunningJob(100 + i, None, 0, (), 0, array=a) for i, a in enumerate(running_arrays)]
    cands = [cand(i, a, caps.get(a) if a else None) for i, (a, _) in enumerate(jobs)]
    p = run(cands, running, cpu)
    started = {s.job_id for s in p.starts}
    for a, cap in caps.items():
        before = sum(1 for r in running if r.array == a)
        new = sum(1 for x in cands if x.array == a and x.job_id in started)
        assert new == 0 or before + new <= cap


def queued(job_id: int, array: int | None) -> Job:
    return Job(job_id, spec(0 if array else None, array=array))


def test_capped_jobs_settle_under_their_array_and_are_read_only_with_room() -> None:
    q = JobQueue()
    jobs = [queued(i, 1) for i in range(1, 6)] + [queued(9, None)]
    for job in jobs:
        q.add(job)
    q.settle_array(jobs[1:])  # the lone job without an array is not settled
    assert q.settled["array:1"] == [(0, i) for i in range(2, 6)]
    assert [k[1] for k in q.keys(q.ends({"gpu": 0, "cpu": 0, "array:1": 0}, 8))] == [1, 9]
    assert [k[1] for k in q.keys(q.ends({"gpu": 0, "cpu": 0, "array:1": 1}, 1))] == [1, 2, 3, 9]
    q.unsettle(jobs[1])
    for job in jobs[2:5]:
        q.remove(job)
    assert "array:1" not in q.settled and len(q) == 3
    assert used_before([(jobs[1], ()), (jobs[5], ())], "array:1", (0, 100)) == 1


def test_a_dispatch_step_settles_the_jobs_held_by_their_arrays_cap() -> None:
    """The engine's turn settles array holds with the rest of the pass: no other writer
    touches the queue."""
    t = Table()
    t.next_id = 1
    t.apply(step(t, c.SubmitJobs((spec(0), spec(1), spec(2))), NOW).changes)
    holds = (Hold(2, "array", "array cap"), Hold(3, "array", "array cap"))
    out = step(t, c.Dispatch((), holds), NOW)
    assert out.changes.settle_array == [2, 3]
    t.apply(out.changes)
    assert [job_id for _, job_id in t.queue.settled["array:1"]] == [2, 3]
