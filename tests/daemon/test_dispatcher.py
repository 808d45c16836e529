"""The queue index. A dispatch pass leaves settled jobs out, yet must decide what a pass
over the whole queue decides: each case runs the daemon's own pass (the scheduler, the
engine, a real SQLite store) through submits, passes and ends, and gives after every
pass the jobs that run, on which cards, and what each queued job shows as waiting for,
written out as admission's rules decide it for the whole queue."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from supervisor.core import admission
from supervisor.core.commands import Ended, SubmitJobs
from supervisor.core.jobqueue import JobQueue, used_before
from supervisor.core.jobs import ExitStatus, Job, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import load
from supervisor.daemon.dispatcher import Dispatcher
from supervisor.daemon.engine import Engine
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.watch.memory import available_mb, read_meminfo

# Host RAM is read from the machine in the daemon; here it is fixed, so that what fits is
# the same on any machine: 89 000 MB free for new jobs while nothing is booked.
HOST = admission.HostMemory(limit_mb=100_000, available_mb=90_000, reserve_mb=1_000)
# Card i has 16 000 + 8 000 * i MB of VRAM: a job asking 20 000 MB fits cards 1 and 2 only.
CARD_MB = (16_000, 24_000, 32_000)


def spec(
    gpus: int = 1,
    priority: int = 0,
    vram_mb: int | None = None,
    mem_mb: int | None = None,
    **more: Any,
) -> JobSpec:
    return JobSpec(
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
        **more,
    )


def job(job_id: int, gpus: int = 1, priority: int = 0) -> Job:
    return Job(id=job_id, spec=spec(gpus, priority))


class Machine:
    """The scheduler of a daemon with `cards` simulated cards and `cpu_slots` slots; jobs
    are started only as far as the engine's claim (no process runs)."""

    def __init__(self, store: Store, cards: int, cpu_slots: int, wait_s: float) -> None:
        cfg = load(None, flags={"state_dir": "/nonexistent", "socket": "/nonexistent.sock"}, env={})
        cfg = dataclasses.replace(
            cfg,
            cpu_slots=cpu_slots,
            host_memory=dataclasses.replace(cfg.host_memory, max_backfill_wait_s=wait_s),
        )
        broker = Broker()
        self.engine = Engine(store, broker)
        book = MemoryBook(store, broker, 0.0)
        all_cards = [admission.Card(i, CARD_MB[i], 0, True, ()) for i in range(cards)]
        self.sched = Dispatcher(
            cfg,
            self.engine,
            book,
            broker,
            cards=lambda: all_cards,
            rss_mb=lambda _: 0,
            mem_total_mb=read_meminfo().total_mb,
            available_mb=available_mb,
        )
        self.sched.host = lambda: HOST  # type: ignore[method-assign]
        self.table = self.engine.table

    async def submit(self, *specs: JobSpec) -> None:
        await self.engine.do(SubmitJobs(specs))

    async def dispatch(self) -> None:
        await self.sched.dispatch_pass()

    async def end(self, job_id: int) -> None:
        n = self.table.live[job_id].attempt.n
        await self.engine.do(Ended(job_id, n, Facts(status=ExitStatus(0, None))))

    def running(self) -> dict[int, tuple[int, ...]]:
        return {job_id: live.cards for job_id, live in self.table.live.items()}

    def waiting(self) -> dict[int, str | None]:
        return {j.id: j.waiting_for for j in self.table.jobs.values() if j.state is JobState.QUEUED}


ONE_GPU_NONE_FREE = "waiting for 1 free GPU, 0 free"
TWO_GPUS_NONE_FREE = "waiting for 2 free GPUs, 0 free"
TWO_GPUS_ONE_FREE = "waiting for 2 free GPUs, 1 free"
NO_ESTIMATE_2 = "no start estimate (job 2 has no time limit)"
NO_ESTIMATE_3 = "no start estimate (job 3 has no time limit)"
DUE_BY_2 = "the rest due by job 2's time limit"
CARD_0_FOR_3 = "waiting for card 0, reserved for job 3"
ONLY_ENDING_BEFORE = "only a job whose --time ends before its start may use them"
ENDS_AFTER_2 = "its start is due by job 2's time limit; --time ends after"
A_CPU_SLOT = "waiting for a free CPU slot"
VRAM_20G = "waiting for VRAM: needs ~20 GiB on one card, ~16 GiB free at most"
ARRAY_1_CAP_2 = "waiting for array 1: at most 2 of its jobs run at once"

# (cards, cpu_slots, max_backfill_wait_s, script). A script step is ("submit", specs),
# ("end", job id), or ("pass", jobs running {id: cards}, queued jobs {id: waiting_for}).
CASES: dict[str, tuple[int, int, float, list[tuple[Any, ...]]]] = {
    "a run of alike jobs takes one card in turn": (
        1,
        1,
        1e9,
        [
            ("submit", [spec()] * 5),
            ("pass", {1: (0,)}, dict.fromkeys((2, 3, 4, 5), ONE_GPU_NONE_FREE)),
            ("end", 1),
            ("pass", {2: (0,)}, dict.fromkeys((3, 4, 5), ONE_GPU_NONE_FREE)),
            ("submit", [spec(gpus=0)]),  # a CPU job passes the settled GPU jobs
            ("pass", {2: (0,), 6: ()}, dict.fromkeys((3, 4, 5), ONE_GPU_NONE_FREE)),
            ("end", 2),
            ("end", 6),
            ("pass", {3: (0,)}, dict.fromkeys((4, 5), ONE_GPU_NONE_FREE)),
        ],
    ),
    "a higher priority goes before the settled jobs": (
        1,
        1,
        1e9,
        [
            ("submit", [spec()] * 3),
            ("pass", {1: (0,)}, {2: ONE_GPU_NONE_FREE, 3: ONE_GPU_NONE_FREE}),
            ("submit", [spec(priority=1)]),
            ("pass", {1: (0,)}, dict.fromkeys((2, 3, 4), ONE_GPU_NONE_FREE)),
            ("end", 1),
            ("pass", {4: (0,)}, {2: ONE_GPU_NONE_FREE, 3: ONE_GPU_NONE_FREE}),
        ],
    ),
    "without a CPU slot the scan ends at the last card: the rest get no words": (
        1,
        0,
        1e9,
        [
            ("submit", [spec()] * 3),
            ("pass", {1: (0,)}, {2: None, 3: None}),
            ("end", 1),
            ("pass", {2: (0,)}, {3: None}),
        ],
    ),
    "a freed card is kept for the first two-card job, not given to a one-card job behind": (
        2,
        1,
        1e9,
        [
            ("submit", [spec(), spec()]),
            ("pass", {1: (0,), 2: (1,)}, {}),
            ("submit", [spec(gpus=2)] * 12 + [spec()]),
            (
                "pass",
                {1: (0,), 2: (1,)},
                {
                    3: f"{TWO_GPUS_NONE_FREE}; cards reserved for it as they free, {NO_ESTIMATE_2}",
                    **dict.fromkeys(range(4, 15), TWO_GPUS_NONE_FREE),
                    15: ONE_GPU_NONE_FREE,
                },
            ),
            ("end", 1),
            # The first 1 + 8 settled jobs are read; the kept card counts as used, so the
            # rest keep their words (a whole-queue pass would start nothing either).
            (
                "pass",
                {2: (1,)},
                {
                    3: f"{TWO_GPUS_ONE_FREE}; card 0 reserved for it, {NO_ESTIMATE_2}",
                    **dict.fromkeys(
                        range(4, 12), f"{TWO_GPUS_NONE_FREE}; card 0 reserved for job 3"
                    ),
                    **dict.fromkeys(range(12, 15), TWO_GPUS_NONE_FREE),
                    15: ONE_GPU_NONE_FREE,
                },
            ),
            ("end", 2),
            (
                "pass",
                {3: (0, 1)},
                {
                    4: f"{TWO_GPUS_NONE_FREE}; cards reserved for it as they free, {NO_ESTIMATE_3}",
                    **dict.fromkeys(range(5, 13), TWO_GPUS_NONE_FREE),
                    **dict.fromkeys(range(13, 15), TWO_GPUS_NONE_FREE),
                    15: ONE_GPU_NONE_FREE,
                },
            ),
        ],
    ),
    "a one-card job whose --time ends before the reservation backfills onto it": (
        2,
        1,
        1e9,
        [
            ("submit", [spec(time_limit_s=3600), spec(time_limit_s=7200)]),
            ("pass", {1: (0,), 2: (1,)}, {}),
            ("end", 1),
            ("submit", [spec(gpus=2), spec(), spec(time_limit_s=9000), spec(time_limit_s=600)]),
            (
                "pass",
                {2: (1,), 6: (0,)},
                {
                    3: f"{TWO_GPUS_ONE_FREE}; card 0 reserved for it, {DUE_BY_2}",
                    4: f"{CARD_0_FOR_3} ({ONLY_ENDING_BEFORE})",
                    5: f"{CARD_0_FOR_3} ({ENDS_AFTER_2})",
                },
            ),
        ],
    ),
    "VRAM only the bigger cards have": (
        3,
        1,
        1e9,
        [
            ("submit", [spec(vram_mb=20_000)] * 4 + [spec(), spec()]),
            (
                "pass",
                {1: (1,), 2: (2,), 5: (0,)},
                {3: VRAM_20G, 4: VRAM_20G, 6: ONE_GPU_NONE_FREE},
            ),
            ("end", 5),
            ("pass", {1: (1,), 2: (2,), 6: (0,)}, {3: VRAM_20G, 4: VRAM_20G}),
            ("end", 1),
            ("pass", {2: (2,), 3: (1,), 6: (0,)}, {4: ONE_GPU_NONE_FREE}),
        ],
    ),
    "CPU jobs settle for the slots while a GPU job takes the card": (
        1,
        2,
        1e9,
        [
            ("submit", [spec(gpus=0)] * 4),
            ("pass", {1: (), 2: ()}, {3: A_CPU_SLOT, 4: A_CPU_SLOT}),
            ("submit", [spec()]),
            ("pass", {1: (), 2: (), 5: (0,)}, {3: A_CPU_SLOT, 4: A_CPU_SLOT}),
            ("end", 1),
            ("pass", {2: (), 3: (), 5: (0,)}, {4: A_CPU_SLOT}),
        ],
    ),
    "a settled job past the backfill wait sets its RAM aside": (
        2,
        1,
        0.0,
        [
            ("submit", [spec(), spec()]),
            ("pass", {1: (0,), 2: (1,)}, {}),
            # Job 3 could never run here (two cards with 20 000 MB): no barrier.
            ("submit", [spec(gpus=2, vram_mb=20_000), spec(mem_mb=50_000)]),
            ("pass", {1: (0,), 2: (1,)}, {3: TWO_GPUS_NONE_FREE, 4: ONE_GPU_NONE_FREE}),
            # 89 000 MB free, 50 000 of it set aside for job 4: 39 000 left.
            ("submit", [spec(gpus=0, mem_mb=45_000)]),
            (
                "pass",
                {1: (0,), 2: (1,)},
                {
                    3: TWO_GPUS_NONE_FREE,
                    4: ONE_GPU_NONE_FREE,
                    5: "waiting for host RAM: needs ~44 GiB, ~38 GiB free",
                },
            ),
            ("submit", [spec(gpus=0, mem_mb=30_000)]),  # fits beside what is set aside
            (
                "pass",
                {1: (0,), 2: (1,), 6: ()},
                {
                    3: TWO_GPUS_NONE_FREE,
                    4: ONE_GPU_NONE_FREE,
                    5: "waiting for host RAM: needs ~44 GiB, ~38 GiB free",
                },
            ),
        ],
    ),
    "a job past the backfill wait for cards holds the GPU jobs behind it": (
        2,
        1,
        0.0,
        [
            ("submit", [spec(time_limit_s=3600), spec(time_limit_s=3600)]),
            ("pass", {1: (0,), 2: (1,)}, {}),
            # Job 4 ends before job 3 is due: the reservation would let it pass, the
            # barrier does not.
            ("submit", [spec(gpus=2), spec(time_limit_s=60)]),
            (
                "pass",
                {1: (0,), 2: (1,)},
                {
                    3: f"{TWO_GPUS_NONE_FREE}; cards reserved for it as they free, "
                    "enough due by job 2's time limit",
                    4: ONE_GPU_NONE_FREE,
                },
            ),
            ("end", 1),
            (
                "pass",
                {2: (1,)},
                {
                    3: f"{TWO_GPUS_ONE_FREE}; card 0 reserved for it, {DUE_BY_2}",
                    4: "waiting behind job 3, which waits for free GPUs",
                },
            ),
            ("end", 2),
            ("pass", {3: (0, 1)}, {4: ONE_GPU_NONE_FREE}),
        ],
    ),
    "an array at its cap waits whatever is free": (
        3,
        1,
        1e9,
        [
            ("submit", [spec(array_index=i, max_running=2) for i in range(4)]),
            ("pass", {1: (0,), 2: (1,)}, {3: ARRAY_1_CAP_2, 4: ARRAY_1_CAP_2}),
            ("pass", {1: (0,), 2: (1,)}, {3: ARRAY_1_CAP_2, 4: ARRAY_1_CAP_2}),
            ("end", 1),
            ("pass", {2: (1,), 3: (0,)}, {4: ARRAY_1_CAP_2}),
        ],
    ),
}


@pytest.mark.parametrize("name", CASES)
async def test_a_pass_decides_for_the_whole_queue(store: Store, name: str) -> None:
    cards, cpu_slots, wait_s, script = CASES[name]
    m = Machine(store, cards, cpu_slots, wait_s)
    for i, op in enumerate(script):
        if op[0] == "submit":
            await m.submit(*op[1])
        elif op[0] == "end":
            await m.end(op[1])
        else:
            await m.dispatch()
            assert (m.running(), m.waiting()) == (op[1], op[2]), f"step {i}"


async def test_settled_jobs_are_left_out_until_a_card_frees(store: Store) -> None:
    m = Machine(store, cards=1, cpu_slots=1, wait_s=1e9)
    await m.submit(*[spec()] * 1000)
    await m.dispatch()  # job 1 starts; 999 are held for the card
    assert len(m.table.queue.settled["gpu"]) == 999 and not m.table.queue.live
    await m.submit(spec(gpus=0))
    reads: list[int] = []
    real = m.table.queue.keys

    def counted(ends: dict[str, int], extra: Any = ()) -> Any:
        keys = list(real(ends, extra))
        reads.extend(job_id for _prio, job_id in keys)
        return iter(keys)

    m.table.queue.keys = counted  # type: ignore[method-assign,assignment]
    await m.dispatch()
    assert reads == [1001]  # only the CPU job was read
    assert m.running() == {1: (0,), 1001: ()}
    reads.clear()
    await m.end(1)
    await m.dispatch()  # the card went to job 2, read among the first few
    assert m.running() == {2: (0,), 1001: ()} and len(reads) < 20


async def test_a_free_cpu_slot_makes_no_plan_for_jobs_settled_on_the_card(store: Store) -> None:
    m = Machine(store, cards=1, cpu_slots=2, wait_s=1e9)
    await m.submit(*[spec()] * 100)
    await m.dispatch()  # job 1 takes the card; 99 are settled, waiting for it
    plans: list[dict[str, int]] = []
    real = m.sched._plan

    def counted(cards: Any, free: dict[str, int], now: float, now_wall: float, w: int = 8) -> Any:
        plans.append(dict(free))
        return real(cards, free, now, now_wall, w)

    m.sched._plan = counted  # type: ignore[method-assign]
    await m.dispatch()
    assert plans == []  # both CPU slots are free, but no queued job can use one
    await m.submit(spec(gpus=0))
    await m.dispatch()
    assert plans == [{"gpu": 0, "cpu": 2}] and 101 in m.running()


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
