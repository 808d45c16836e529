"""The queue index: a pass that leaves settled jobs out must decide what a pass over the
whole queue decides. Checked against admission.plan over every queued job, through
random submits, passes and ends, with and without starvation barriers."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core import admission
from supervisor.core.commands import Dispatch, Now
from supervisor.core.engine import step
from supervisor.core.jobqueue import JobQueue, used_before
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Attempt
from supervisor.core.table import Changes, Live, Phase
from supervisor.daemon.broker import Broker
from supervisor.daemon.clock import monotonic
from supervisor.daemon.config import load
from supervisor.daemon.engine import Engine
from supervisor.daemon.membook import MemoryBook
from supervisor.daemon.scheduler import Dispatcher

HOST = admission.HostMemory(limit_mb=100_000, available_mb=90_000, reserve_mb=1_000)


def job(
    job_id: int,
    gpus: int = 1,
    priority: int = 0,
    vram_mb: int | None = None,
    mem_mb: int | None = None,
) -> Job:
    spec = JobSpec(
        argv=("true",),
        cwd="/",
        env={},
        owner_uid=0,
        owner_gid=0,
        gpus=gpus,
        vram_mb=vram_mb,
        mem_mb=mem_mb,
        priority=priority,
        mem_key="k",
    )
    return Job(id=job_id, spec=spec)


def scheduler(cards: int, cpu_slots: int, wait_s: float) -> Dispatcher:
    cfg = load(None, flags={"state_dir": "/nonexistent", "socket": "/nonexistent.sock"}, env={})
    cfg = dataclasses.replace(
        cfg,
        cpu_slots=cpu_slots,
        host_memory=dataclasses.replace(cfg.host_memory, max_backfill_wait_s=wait_s),
    )
    broker = Broker()
    engine = Engine(None, broker)  # type: ignore[arg-type]  # passes here step the table only
    book = MemoryBook(None, broker, 0.0)  # type: ignore[arg-type]
    all_cards = [admission.Card(i, 16_000 + 8_000 * i, 0, True, ()) for i in range(cards)]
    sched = Dispatcher(cfg, engine, book, broker, cards=lambda: all_cards, rss_mb=lambda _: 0)
    sched.host = lambda: HOST  # type: ignore[method-assign]
    return sched


def enqueue(sched: Dispatcher, j: Job) -> None:
    sched.table.apply(Changes(jobs={j.id: j}))


def full_plan(sched: Dispatcher, cards: list[admission.Card], free_cpu: int) -> admission.Plan:
    """The reference: admission.plan over every queued job, settled or not."""
    queued = sorted(
        (-j.spec.priority, j.id) for j in sched.table.jobs.values() if j.state is JobState.QUEUED
    )
    return admission.plan(
        sched._candidates(1e18, queued),
        cards=cards,
        cpu_slots_free=free_cpu,
        host=HOST,
        running=sched.running_use(),
        now=monotonic(),
        max_backfill_wait_s=sched.cfg.host_memory.max_backfill_wait_s,
    )


def one_pass(sched: Dispatcher) -> None:
    """dispatch_pass without the store and without launching: check, then step."""
    cards = sched.cards_now()
    free = {"gpu": sum(1 for c in cards if c.healthy and not c.running)}
    free["cpu"] = sched.cpu_slots_free()
    reference = full_plan(sched, cards, free["cpu"])
    plan = sched._plan(cards, free, monotonic(), 1e18)
    assert plan.starts == reference.starts
    decided = {h.job_id: h for h in plan.holds}
    for hold in reference.holds:
        if hold.job_id in decided:
            assert decided[hold.job_id] == hold
        else:  # left out: it must be held already, exactly so
            current = sched.table.jobs[hold.job_id]
            assert sched.table.queue.settled_kind.get(hold.job_id) is not None
            assert (current.hold_reason, current.waiting_for) == (hold.reason, hold.message)
    full = frozenset(kind for kind, n in free.items() if n <= 0)
    out = step(sched.table, Dispatch(plan.starts, plan.holds, full=full), Now(1e9, monotonic()))
    sched.table.apply(out.changes)


def end_one(sched: Dispatcher, pick: int) -> None:
    running = sched.table.live
    if running:
        job_id = sorted(running)[pick % len(running)]
        del running[job_id]
        del sched.table.jobs[job_id]


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(1, 12),  # a batch of alike jobs: runs of settled ones
            st.integers(0, 2),  # GPUs
            st.integers(0, 1),  # priority
            st.sampled_from([None, 20_000]),  # VRAM: only the bigger cards have it
            st.sampled_from([None, 30_000, 60_000]),  # host RAM: holds and set-asides
        ),
        st.tuples(st.just("pass")),
        st.tuples(st.just("end"), st.integers(0, 10)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    cards=st.integers(1, 3),
    cpu_slots=st.integers(0, 2),
    starving=st.booleans(),
    script=ops,
)
def test_a_pass_decides_what_a_pass_over_the_whole_queue_decides(
    cards: int, cpu_slots: int, starving: bool, script: list[tuple[Any, ...]]
) -> None:
    sched = scheduler(cards, cpu_slots, 0.0 if starving else 1e9)
    next_id = 1
    for op in script:
        if op[0] == "submit":
            _, count, gpus, priority, vram_mb, mem_mb = op
            for _ in range(count):
                enqueue(sched, job(next_id, min(gpus, cards), priority, vram_mb, mem_mb))
                next_id += 1
        elif op[0] == "pass":
            one_pass(sched)
        else:
            end_one(sched, op[1])
    one_pass(sched)


def test_settled_jobs_are_left_out_until_a_card_frees() -> None:
    sched = scheduler(cards=1, cpu_slots=1, wait_s=1e9)
    for i in range(1, 1001):
        enqueue(sched, job(i))
    one_pass(sched)  # job 1 starts; 999 are held for the card
    assert len(sched.table.queue.settled["gpu"]) == 999 and not sched.table.queue.live
    enqueue(sched, job(1001, gpus=0))
    reads: list[int] = []
    real = sched.table.queue.keys

    def counted(ends: dict[str, int], extra: Any = ()) -> Any:
        keys = list(real(ends, extra))
        reads.extend(job_id for _prio, job_id in keys)
        return iter(keys)

    sched.table.queue.keys = counted  # type: ignore[method-assign]
    one_pass(sched)
    assert reads == [1001]  # only the CPU job was read
    reads.clear()
    end_one(sched, 0)
    one_pass(sched)  # the card went to job 2, read among the first few
    assert 2 in sched.table.live and len(reads) < 20


def busy(sched: Dispatcher, job_id: int, cards: tuple[int, ...]) -> None:
    """A job that runs already (on `cards`, or a CPU slot when empty)."""
    sched.table.jobs[job_id] = dataclasses.replace(job(job_id, len(cards)), state=JobState.RUNNING)
    sched.table.seq += 1
    attempt = Attempt(job_id, 1, cards, "", "k")
    sched.table.live[job_id] = Live(attempt, cards, sched.table.seq, Phase.RUNNING, None, 0, 0.0)


def test_a_freed_card_goes_past_jobs_that_cannot_take_it() -> None:
    """The first settled jobs read when a card frees need two: the plan is made again,
    reading further, until it finds the one-card job behind them."""
    sched = scheduler(cards=2, cpu_slots=1, wait_s=1e9)  # a free slot: passes read the queue
    busy(sched, 100, (0,))
    busy(sched, 101, (1,))
    for i in range(1, 13):
        enqueue(sched, job(i, gpus=2))
    enqueue(sched, job(13))
    one_pass(sched)
    assert len(sched.table.queue.settled["gpu"]) == 13
    end_one(sched, 0)
    one_pass(sched)
    assert 13 in sched.table.live


def test_a_settled_job_past_the_backfill_wait_is_still_a_barrier() -> None:
    """Held past max_backfill_wait_s, a job waiting for cards sets its RAM aside: the CPU
    job behind it must not take that RAM, though the settled job itself is not read."""
    sched = scheduler(cards=2, cpu_slots=1, wait_s=0.0)
    busy(sched, 100, (0,))
    busy(sched, 101, (1,))
    enqueue(sched, job(1, gpus=2, vram_mb=20_000))  # cannot ever run here: no barrier
    enqueue(sched, job(2, mem_mb=50_000))  # the barrier
    one_pass(sched)
    assert sched.table.queue.settled["gpu"] == [(0, 1), (0, 2)]
    enqueue(sched, job(3, gpus=0, mem_mb=45_000))
    one_pass(sched)
    assert 3 not in sched.table.live
    assert sched.table.jobs[3].hold_reason == "host_ram"


def test_a_job_told_how_many_cards_were_free_is_settled_only_when_none_was() -> None:
    """ "2 free GPUs, 1 free" is not what a pass with none free would say."""
    sched = scheduler(cards=2, cpu_slots=1, wait_s=1e9)
    busy(sched, 100, (0,))
    enqueue(sched, job(1, gpus=2))
    enqueue(sched, job(2))
    one_pass(sched)  # job 2 takes the free card; job 1 was told "1 free"
    assert 2 in sched.table.live and 1 not in sched.table.queue.settled_kind
    one_pass(sched)  # none free now: read again, told "0 free", settled
    assert sched.table.jobs[1].waiting_for == "waiting for 2 free GPUs, 0 free"
    assert 1 in sched.table.queue.settled_kind


def test_a_job_held_for_another_reason_is_not_settled() -> None:
    q = JobQueue()
    a, b = job(1), job(2)
    q.add(a)
    q.add(b)
    q.settle([a], {})
    assert q.live == [(0, 2)] and q.settled["gpu"] == [(0, 1)]
    q.unsettle(a)
    assert q.live == [(0, 1), (0, 2)] and not q.settled["gpu"] and len(q) == 2


def test_held_counts_follow_every_change_once() -> None:
    q = JobQueue()
    held = dataclasses.replace(job(1), hold_reason="host_ram")
    q.add(held)
    q.set_hold(1, "gpus")
    assert q.held_counts() == {"gpus": 1}
    q.remove(held)
    q.remove(held)  # a job is taken out by its start and again by its state change
    assert q.held_counts() == {}


def test_next_backoff_skips_entries_that_no_longer_hold() -> None:
    q = JobQueue()
    q.add(dataclasses.replace(job(1), not_before=50.0))
    q.add(dataclasses.replace(job(2), not_before=80.0))
    assert q.next_backoff(10.0, lambda job_id, at: job_id != 1) == 70.0
    assert q.next_backoff(90.0, lambda job_id, at: True) is None


def test_used_before_counts_units_ahead_of_the_cut() -> None:
    started = [(job(1, gpus=2), (0, 1)), (job(5, gpus=0), ()), (job(9), (2,))]
    assert used_before(started, "gpu", (0, 7)) == 2
    assert used_before(started, "cpu", (0, 7)) == 1


def test_settling_keeps_the_queue_order_of_a_kind() -> None:
    q = JobQueue()
    jobs = [job(i, priority=p) for i, p in ((1, 0), (2, 1), (3, 0), (4, 1))]
    for j in jobs:
        q.add(j)
    q.settle([jobs[2], jobs[0]], {})
    q.settle([jobs[3]], {})
    assert q.settled["gpu"] == [(-1, 4), (0, 1), (0, 3)]


def test_starving_keeps_its_estimate_of_the_oldest_settled_job_true() -> None:
    q = JobQueue()
    jobs = [job(i) for i in (1, 2, 3)]
    for j in jobs:
        q.add(j)
    since = {1: 50.0, 2: 10.0, 3: 30.0}
    q.settle(jobs, since)
    q.remove(jobs[1])  # the oldest leaves: the estimate (10) is now too low
    assert q.starving("gpu", 0, now=115.0, limit=100.0, held_since=since, possible=bool) == []
    assert q.oldest["gpu"] == 30.0  # it read them all: exact again
    assert q.starving("gpu", 0, now=135.0, limit=100.0, held_since=since, possible=bool) == [(0, 3)]
    first_possible = q.starving("gpu", 0, 200.0, 100.0, since, possible=lambda i: i == 3)
    assert first_possible == [(0, 1), (0, 3)]  # the one that could not run, then the one


# --- the bookkeeping by table ---------------------------------------------------------------


def test_used_before_counts_every_unit_of_the_kind_before_the_cut() -> None:
    started = [(job(1), (0,)), (job(2, gpus=2), (1, 2)), (job(3, gpus=0), ()), (job(9), (3,))]
    assert used_before(started, "gpu", (0, 5)) == 3  # jobs 1 and 2, not 9
    assert used_before(started, "cpu", (0, 5)) == 1
    assert used_before(started, "gpu", (0, 1)) == 0


def test_len_counts_live_and_settled_jobs() -> None:
    q = JobQueue()
    for i in (1, 2, 3):
        q.add(job(i))
    q.settle([job(2), job(3)], {2: 5.0, 3: 6.0})
    assert (len(q), len(q.live), len(q.settled["gpu"])) == (3, 1, 2)


def test_holds_are_counted_from_add_to_remove() -> None:
    q = JobQueue()
    q.add(dataclasses.replace(job(1), hold_reason="vram"))
    q.add(dataclasses.replace(job(2), hold_reason="vram"))
    q.add(dataclasses.replace(job(3), hold_reason="host_ram"))
    assert q.held_counts() == {"vram": 2, "host_ram": 1}
    q.set_hold(1, "gpus")
    assert q.held_counts() == {"vram": 1, "host_ram": 1, "gpus": 1}
    q.remove(job(2))
    q.remove(job(3))
    assert q.held_counts() == {"gpus": 1}


def test_starving_reads_from_the_first_held_long_enough_to_the_first_possible() -> None:
    q = JobQueue()
    jobs = [job(i) for i in (1, 2, 3, 4)]
    for j in jobs:
        q.add(j)
    # Job 2 has no held_since: it counts as held since now.
    held_since = {1: 100.0, 3: 0.0, 4: 0.0}
    q.settle(jobs, held_since)
    found = q.starving("gpu", 0, 200.0, 100.0, held_since, lambda job_id: job_id == 4)
    assert found == [(0, 1), (0, 3), (0, 4)]  # job 1 at exactly the limit counts
    assert q.starving("gpu", 0, 199.0, 100.0, held_since, lambda job_id: False) == [
        (0, 3),
        (0, 4),
    ]


def test_starving_returns_nothing_early_only_when_no_one_has_waited_the_limit() -> None:
    q = JobQueue()
    q.add(job(1))
    q.settle([job(1)], {1: 100.0})
    assert q.starving("gpu", 0, 200.0, 100.0, {1: 100.0}, lambda job_id: True) == [(0, 1)]
    assert q.starving("gpu", 0, 199.9, 100.0, {1: 100.0}, lambda job_id: True) == []


def test_next_backoff_by_table() -> None:
    q = JobQueue()
    q.add(dataclasses.replace(job(1), not_before=5.0))
    q.add(dataclasses.replace(job(2), not_before=9.0))
    current = {1: 5.0, 2: 9.0}
    assert q.next_backoff(1.0, lambda i, at: current[i] == at) == 4.0
    assert q.next_backoff(5.0, lambda i, at: current[i] == at) == 4.0  # 5.0 is over
    current[2] = 20.0  # retried since, with another backoff: this entry is stale
    assert q.next_backoff(5.0, lambda i, at: current[i] == at) is None
