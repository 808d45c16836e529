"""InUse: the running jobs' use summed once, and grown claim by claim, plans as the list
of those jobs does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.admission import Candidate, Card, HostMemory, RunningJob, plan
from supervisor.core.in_use import InUse, free_for_new_mb
from supervisor.core.projection import Projection

GB = 1024
HOST = HostMemory(limit_mb=64 * GB, available_mb=60 * GB, reserve_mb=2 * GB)

jobs = st.builds(
    RunningJob,
    job_id=st.integers(1, 10_000),
    projected_mb=st.none() | st.integers(0, 8 * GB),
    rss_mb=st.integers(0, 8 * GB),
    gpus=st.sampled_from([(), (0,), (1,), (0, 1)]),
    vram_reserved_mb=st.integers(0, 8 * GB),
    shared=st.booleans(),
    array=st.none() | st.integers(1, 3),
)
unique_jobs = st.lists(jobs, max_size=12, unique_by=lambda j: j.job_id)


def test_the_sum_books_each_job_at_its_projection_or_its_rss_if_more() -> None:
    use = InUse.of([RunningJob(1, 3 * GB, GB, (0,), 0), RunningJob(2, None, 2 * GB, (1,), 0)])
    assert (use.booked_mb, use.growth_mb) == (5 * GB, 2 * GB)
    # The ledger: 64 - 5; the machine, stricter: 60 - 2 still to grow into; less the reserve.
    assert use.free_for_new_mb(HOST) == 56 * GB


@given(unique_jobs, st.integers(0, 12))
def test_claims_added_one_by_one_sum_as_the_whole_list(running: list[RunningJob], k: int) -> None:
    use = InUse.of(running[:k])
    for job in running[k:]:
        use.add(job)
    whole = InUse.of(running)
    assert use == whole
    assert use.free_for_new_mb(HOST) == free_for_new_mb(HOST, running)
    arrays = [j.array for j in running if j.array is not None]
    assert dict(use.arrays) == {a: arrays.count(a) for a in set(arrays)}


@given(unique_jobs, st.integers(0, 12))
def test_a_plan_over_the_sum_is_the_plan_over_the_list(running: list[RunningJob], k: int) -> None:
    on = {0: tuple(j.job_id for j in running if 0 in j.gpus)}
    on[1] = tuple(j.job_id for j in running if 1 in j.gpus)
    cards = [Card(i, 24 * GB, 0, True, on[i]) for i in (0, 1)]
    queue = [
        Candidate(20_001, 1, 4 * GB, Projection(30 * GB, "observed", 1), None, share=True),
        Candidate(20_002, 0, None, Projection(20 * GB, "observed", 1), None, array=2, cap=2),
        Candidate(20_003, 1, None, None, None),
    ]
    use = InUse.of(running[:k])
    for job in running[k:]:
        use.add(job)

    def planned(over: list[RunningJob] | InUse) -> object:
        return plan(
            queue,
            cards=cards,
            cpu_slots_free=1,
            host=HOST,
            running=over,
            now=0.0,
            max_backfill_wait_s=60.0,
        )

    assert planned(use) == planned(running)
    assert use == InUse.of(running)  # a plan reads the sum, it does not change it
