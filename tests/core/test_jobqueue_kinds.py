"""The queue index's kinds: arrays settled by their cap, a kind the pass has no count
for, and where a starvation scan begins."""

from __future__ import annotations

from supervisor.core.jobqueue import JobQueue, in_kind, used_before
from supervisor.core.jobs import Job, JobSpec


def job(job_id: int, gpus: int = 1, array_id: int | None = None) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, gpus=gpus, array_id=array_id, max_running=1)
    return Job(id=job_id, spec=spec)


def test_a_job_is_of_its_own_array_only() -> None:
    assert in_kind(job(1, array_id=3), "array:3")
    assert not in_kind(job(1, array_id=3), "array:5")
    assert not in_kind(job(1), "array:3")
    assert in_kind(job(1, gpus=0), "cpu") and not in_kind(job(1, gpus=0), "gpu")


def test_every_cpu_job_before_the_cut_takes_a_slot() -> None:
    started = [(job(1, gpus=0), ()), (job(2, gpus=0), ()), (job(8, gpus=0), ())]
    assert used_before(started, "cpu", (0, 5)) == 2


def test_an_array_s_jobs_settle_together_and_its_list_goes_when_empty() -> None:
    q = JobQueue()
    jobs = [job(i, array_id=1) for i in (1, 2, 3)]
    for j in jobs:
        q.add(j)
    q.settle_array([jobs[2]])
    q.settle_array([jobs[0]])
    assert q.settled["array:1"] == [(0, 1), (0, 3)] and q.live == [(0, 2)]
    q.unsettle(jobs[0])
    q.remove(jobs[2])
    assert "array:1" not in q.settled and q.live == [(0, 1), (0, 2)]


def test_a_kind_with_no_count_is_not_read() -> None:
    q = JobQueue()
    jobs = [job(i, gpus=0) for i in (1, 2)]
    for j in jobs:
        q.add(j)
    q.settle(jobs, {})
    assert q.ends({"gpu": 1}, 8) == {"gpu": 0, "cpu": 0}
    assert q.ends({"gpu": 1, "cpu": 1}, 8) == {"gpu": 0, "cpu": 2}


def test_an_array_s_cap_is_never_a_barrier() -> None:
    q = JobQueue()
    a = job(1, array_id=4)
    q.add(a)
    q.settle_array([a])
    assert q.starving("array:4", 0, 1000.0, 10.0, {1: 0.0}, lambda _id: True) == []


def test_a_starvation_scan_begins_where_it_is_told() -> None:
    q = JobQueue()
    jobs = [job(i) for i in (1, 2, 3)]
    for j in jobs:
        q.add(j)
    since = {1: 0.0, 2: 0.0, 3: 0.0}
    q.settle(jobs, since)
    assert q.starving("gpu", 1, 200.0, 100.0, since, lambda _id: False) == [(0, 2), (0, 3)]
