from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.admission import (
    Candidate,
    Card,
    Hold,
    HostMemory,
    Plan,
    RunningJob,
    Start,
    card_free_vram_mb,
    free_for_new_mb,
    gb,
    plan,
)
from supervisor.core.projection import Projection

GB = 1024
CARD = 24 * GB
# The story's box: 125 GB, 5 % reserve.
HOST = HostMemory(limit_mb=125 * GB, available_mb=120 * GB, reserve_mb=6 * GB)
NOW = 10_000.0
WAIT = 900.0
TWO_OF_ONE = "waiting for 2 free GPUs, 1 free"


def cand(
    job_id: int,
    *,
    gpus: int = 1,
    vram_mb: int | None = None,
    mb: int | None = None,
    held_since: float | None = None,
    time_s: float | None = None,
) -> Candidate:
    projection = Projection(mb, "observed", 1) if mb is not None else None
    return Candidate(job_id, gpus, vram_mb, projection, held_since, time_limit_s=time_s)


def idle(*indices: int, used: int = 0) -> list[Card]:
    return [Card(i, CARD, used, True, ()) for i in indices]


def run(
    candidates: Sequence[Candidate],
    *,
    cards: Sequence[Card] | None = None,
    cpu: int = 0,
    host: HostMemory = HOST,
    running: Sequence[RunningJob] = (),
) -> Plan:
    return plan(
        candidates,
        cards=idle(0, 1) if cards is None else cards,
        cpu_slots_free=cpu,
        host=host,
        running=running,
        now=NOW,
        max_backfill_wait_s=WAIT,
    )


def busy_card(index: int, job_id: int) -> Card:
    return Card(index, CARD, 20 * GB, True, (job_id,))


def running_job(
    job_id: int,
    mb: int | None,
    rss: int,
    gpus: tuple[int, ...] = (0,),
    ends_in_s: float | None = None,
) -> RunningJob:
    return RunningJob(job_id, mb, rss, gpus, 0, ends_in_s=ends_in_s)


# --- the free figure ------------------------------------------------------------------


def test_free_for_new_is_bounded_by_the_ledger() -> None:
    host = HostMemory(limit_mb=100_000, available_mb=90_000, reserve_mb=5_000)
    # Ledger: 100000 - 63000 = 37000; machine: 90000 - (63000 - 10000) = 37000 as well.
    jobs = [running_job(1, 63_000, 10_000)]
    assert free_for_new_mb(host, jobs) == 37_000 - 5_000


def test_free_for_new_is_bounded_by_memavailable() -> None:
    # Something outside the jobs took memory: MemAvailable is the smaller view.
    host = HostMemory(limit_mb=100_000, available_mb=40_000, reserve_mb=5_000)
    jobs = [running_job(1, 30_000, 20_000)]
    assert free_for_new_mb(host, jobs) == (40_000 - 10_000) - 5_000


def test_a_job_past_its_projection_counts_at_its_rss() -> None:
    host = HostMemory(limit_mb=100_000, available_mb=100_000, reserve_mb=0)
    assert free_for_new_mb(host, [running_job(1, 30_000, 50_000)]) == 50_000
    assert free_for_new_mb(host, [running_job(1, None, 50_000)]) == 50_000


# --- host RAM -------------------------------------------------------------------------


def test_the_story_two_63_gb_jobs_do_not_start_together() -> None:
    # 114 GB free (MemAvailable 120 less the 6 GB reserve): the first fits, 51 GB remain.
    p = run([cand(1, mb=63 * GB), cand(2, mb=63 * GB)])
    assert p.starts == (Start(1, (0,), 0),)
    assert p.holds == (Hold(2, "host_ram", "waiting for host RAM: needs ~63 GiB, ~51 GiB free"),)


def test_held_while_an_older_job_is_projected_to_grow() -> None:
    running = [running_job(9, 63 * GB, 10 * GB)]
    p = run([cand(1, mb=63 * GB)], cards=[busy_card(0, 9), *idle(1)], running=running)
    assert p.starts == ()
    assert [(h.job_id, h.reason) for h in p.holds] == [(1, "host_ram")]


def test_a_lone_job_is_never_held_even_above_the_limit() -> None:
    p = run([cand(1, mb=500 * GB), cand(2, mb=1 * GB)])
    assert p.starts[0] == Start(1, (0,), 0)
    # Once it started, nothing is lone any more.
    assert [(h.job_id, h.reason) for h in p.holds] == [(2, "host_ram")]


def test_a_job_without_a_figure_is_never_held() -> None:
    running = [running_job(9, 120 * GB, 120 * GB)]
    p = run([cand(1)], cards=[busy_card(0, 9), *idle(1)], running=running)
    assert p.starts == (Start(1, (1,), 0),)


def test_each_start_reduces_the_free_figure_for_the_next() -> None:
    cards = idle(0, 1, 2)
    p = run([cand(1, mb=50 * GB), cand(2, mb=50 * GB), cand(3, mb=20 * GB)], cards=cards)
    # 114 GB free: 50 + 50 fit, the third would need 20 of the 14 left.
    assert [s.job_id for s in p.starts] == [1, 2]
    assert [h.job_id for h in p.holds] == [3]


# --- backfill and the starvation cut-off ----------------------------------------------


def test_backfill_past_a_recently_held_job() -> None:
    running = [running_job(9, 80 * GB, 80 * GB, (2,))]
    cards = [*idle(0, 1), busy_card(2, 9)]
    p = run(
        [cand(1, mb=60 * GB, held_since=NOW - 60), cand(2, mb=10 * GB)],
        cards=cards,
        running=running,
    )
    assert p.starts == (Start(2, (0,), 0),)
    assert [(h.job_id, h.reason) for h in p.holds] == [(1, "host_ram")]


def test_nothing_passes_a_job_held_longer_than_the_backfill_limit() -> None:
    running = [running_job(9, 80 * GB, 80 * GB, (2,))]
    cards = [*idle(0, 1), busy_card(2, 9)]
    candidates = [
        cand(1, mb=60 * GB, held_since=NOW - WAIT),
        cand(2, mb=10 * GB),
        cand(3, gpus=0, mb=1 * GB),
    ]
    p = run(candidates, cards=cards, running=running, cpu=4)
    assert p.starts == ()
    assert p.holds[0].reason == "host_ram"
    behind = "waiting behind job 1, which waits for host RAM"
    assert p.holds[1:] == (Hold(2, "host_ram", behind), Hold(3, "host_ram", behind))


def test_behind_a_starving_gang_job_gpu_jobs_wait_and_cpu_jobs_still_run() -> None:
    cards = [*idle(0), busy_card(1, 9)]
    # Job 2 ends before job 9 frees card 1, so only the barrier keeps it off card 0.
    running = [running_job(9, 10 * GB, 10 * GB, (1,), ends_in_s=3600)]
    candidates = [
        cand(1, gpus=2, held_since=NOW - 2 * WAIT),
        cand(2, time_s=60),
        cand(3, gpus=0),
    ]
    p = run(candidates, cards=cards, running=running, cpu=1)
    assert p.starts == (Start(3, (), 0),)
    assert p.holds == (
        Hold(
            1, "gpus", f"{TWO_OF_ONE}; card 0 reserved for it, the rest due by job 9's time limit"
        ),
        Hold(2, "gpus", "waiting behind job 1, which waits for free GPUs"),
    )


def test_ram_is_set_aside_for_a_starving_gpu_job() -> None:
    cards = [busy_card(0, 9)]
    running = [running_job(9, 10 * GB, 10 * GB)]
    # 109 GB free (115 by the ledger, less the reserve). The starving job's 80 GB is set
    # aside, so a 40 GB CPU job must wait.
    candidates = [cand(1, mb=80 * GB, held_since=NOW - WAIT), cand(2, gpus=0, mb=40 * GB)]
    p = run(candidates, cards=cards, running=running, cpu=1)
    assert p.starts == ()
    assert [(h.job_id, h.reason) for h in p.holds] == [(1, "gpus"), (2, "host_ram")]


def test_a_job_that_can_never_start_does_not_block_the_queue() -> None:
    candidates = [cand(1, gpus=3, held_since=NOW - 10 * WAIT), cand(2)]
    p = run(candidates)
    assert p.starts == (Start(2, (0,), 0),)
    assert p.holds == (Hold(1, "gpus", "waiting for 3 free GPUs, 2 free"),)


# --- cards, VRAM and CPU slots --------------------------------------------------------


def test_a_gang_job_takes_all_its_cards_at_once() -> None:
    p = run([cand(1, gpus=2), cand(2)], cards=idle(0, 1, 2))
    assert p.starts == (Start(1, (0, 1), 0), Start(2, (2,), 0))


def test_a_gang_job_waits_for_enough_free_cards() -> None:
    cards = [*idle(0), busy_card(1, 9)]
    running = [running_job(9, None, 1 * GB, (1,))]
    p = run([cand(1, gpus=2)], cards=cards, running=running)
    unknown = "no start estimate (job 9 has no time limit)"
    assert p == Plan(
        (), (Hold(1, "gpus", f"{TWO_OF_ONE}; card 0 reserved for it, {unknown}"),), (0,)
    )


def test_vram_goes_to_a_card_that_has_it_and_is_reserved() -> None:
    cards = [Card(0, CARD, 16 * GB, True, ()), Card(1, CARD, 0, True, ())]
    p = run([cand(1, vram_mb=20 * GB), cand(2, vram_mb=20 * GB)], cards=cards)
    assert p.starts == (Start(1, (1,), 20 * GB),)
    assert p.holds == (
        Hold(2, "vram", "waiting for VRAM: needs ~20 GiB on one card, ~8 GiB free at most"),
    )


def test_vram_best_fit_keeps_the_big_card_for_the_big_job() -> None:
    cards = [Card(0, 48 * GB, 0, True, ()), Card(1, CARD, 0, True, ())]
    p = run([cand(1, vram_mb=10 * GB), cand(2, vram_mb=40 * GB)], cards=cards)
    assert p.starts == (Start(1, (1,), 10 * GB), Start(2, (0,), 40 * GB))


def test_gang_vram_message_counts_the_cards_that_have_it() -> None:
    cards = [Card(0, CARD, 0, True, ()), Card(1, CARD, 20 * GB, True, ())]
    p = run([cand(1, gpus=2, vram_mb=20 * GB)], cards=cards)
    message = "waiting for VRAM: needs ~20 GiB on each of 2 cards, 1 have it"
    unknown = "no start estimate (no running job frees a card that fits it)"
    assert p.holds == (Hold(1, "vram", f"{message}; card 0 reserved for it, {unknown}"),)


def test_booked_vram_counts_even_before_the_job_uses_it() -> None:
    card = Card(0, CARD, 2 * GB, True, (7,))
    assert card_free_vram_mb(card, [20 * GB]) == 4 * GB
    assert card_free_vram_mb(card, []) == 22 * GB


def test_cpu_jobs_use_cpu_slots() -> None:
    p = run([cand(1, gpus=0), cand(2, gpus=0), cand(3, gpus=0), cand(4)], cards=idle(0), cpu=2)
    assert p.starts == (Start(1, (), 0), Start(2, (), 0), Start(4, (0,), 0))
    assert p.holds == (Hold(3, "cpu", "waiting for a free CPU slot"),)


def test_lost_cards_are_skipped() -> None:
    cards = [Card(0, CARD, 0, False, ()), Card(1, CARD, 0, True, ())]
    p = run([cand(1), cand(2)], cards=cards)
    assert p.starts == (Start(1, (1,), 0),)
    assert p.holds == ()  # no card left: the scan stopped


# --- cost and determinism -------------------------------------------------------------


class CountingSequence(Sequence[Candidate]):
    """A queue that counts how many of its items were looked at."""

    def __init__(self, items: Sequence[Candidate]) -> None:
        self.items = items
        self.touched = 0

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, i: int) -> Candidate: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Candidate]: ...
    def __getitem__(self, i: int | slice) -> Candidate | Sequence[Candidate]:
        if isinstance(i, slice):
            raise AssertionError("plan() must not copy the queue")
        self.touched += 1
        return self.items[i]

    def __iter__(self) -> Iterator[Candidate]:
        for item in self.items:
            self.touched += 1
            yield item


def test_a_full_machine_makes_an_empty_plan_without_reading_the_queue() -> None:
    queue = CountingSequence([cand(i) for i in range(100_000)])
    cards = [busy_card(0, -1), busy_card(1, -2)]
    running = [running_job(-1, None, 1), running_job(-2, None, 1, (1,))]
    p = run(queue, cards=cards, running=running, cpu=0)
    assert p == Plan((), ())
    assert queue.touched <= 1


def test_the_scan_stops_when_the_last_card_is_taken() -> None:
    queue = CountingSequence([cand(i) for i in range(100_000)])
    p = run(queue, cards=idle(0, 1), cpu=0)
    assert [s.job_id for s in p.starts] == [0, 1]
    assert queue.touched <= 3


def test_same_input_same_plan() -> None:
    cards = [Card(0, CARD, 3 * GB, True, ()), Card(1, CARD, 3 * GB, True, ()), *idle(2)]
    candidates = [cand(i, gpus=i % 3, vram_mb=(i % 4) * 6 * GB, mb=i * GB) for i in range(40)]
    first = run(candidates, cards=cards, cpu=3)
    assert first == run(list(candidates), cards=list(cards), cpu=3)
    assert first.starts  # not a vacuous comparison


def test_gb_rounds_for_people() -> None:
    assert gb(95_232) == "~93 GiB"
    assert gb(1536) == "~1.5 GiB"
    assert gb(2048) == "~2 GiB"
    assert gb(0) == "~0 GiB"


jobs = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(1, CARD)),  # vram
        st.one_of(st.none(), st.integers(0, 400 * GB)),  # projection
        st.one_of(st.none(), st.floats(0, 3 * WAIT)),  # held for this long
    ),
    max_size=25,
)


@given(jobs, st.integers(1, 200 * GB))
def test_one_gpu_and_gpu_jobs_only_is_exactly_fifo(
    specs: list[tuple[int | None, int | None, float | None]], limit: int
) -> None:
    queue = [
        cand(i, vram_mb=v, mb=m, held_since=None if w is None else NOW - w)
        for i, (v, m, w) in enumerate(specs)
    ]
    host = HostMemory(limit_mb=limit, available_mb=limit, reserve_mb=limit // 20)
    order: list[int] = []
    while queue:
        # While the card is busy nothing starts, and nothing is even looked at.
        busy = run(
            queue,
            cards=[busy_card(0, -1)],
            host=host,
            running=[running_job(-1, None, 1)],
        )
        assert busy == Plan((), ())
        p = run(queue, cards=idle(0), host=host)
        assert len(p.starts) == 1
        order.append(p.starts[0].job_id)
        queue = [c for c in queue if c.job_id != p.starts[0].job_id]
    assert order == list(range(len(specs)))


scenario = st.tuples(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # gpus
            st.one_of(st.none(), st.integers(1, CARD)),  # vram per card
            st.one_of(st.none(), st.integers(0, 150 * GB)),  # projection
            st.one_of(st.none(), st.floats(0, 2 * WAIT)),  # held for this long
        ),
        max_size=30,
    ),
    st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, CARD)), max_size=4),
    st.integers(0, 3),  # cpu slots free
    st.lists(st.integers(0, 60 * GB), max_size=3),  # running jobs' projections
)


@given(scenario)
def test_a_plan_never_overbooks(
    data: tuple[
        list[tuple[int, int | None, int | None, float | None]],
        list[tuple[bool, bool, int]],
        int,
        list[int],
    ],
) -> None:
    specs, card_specs, cpu, running_mb = data
    queue = [
        cand(i, gpus=g, vram_mb=v, mb=m, held_since=None if w is None else NOW - w)
        for i, (g, v, m, w) in enumerate(specs)
    ]
    running = [RunningJob(100 + i, mb, mb // 2, (), 0) for i, mb in enumerate(running_mb)]
    cards = [
        Card(i, CARD, used, healthy, (100,) if busy else ())
        for i, (healthy, busy, used) in enumerate(card_specs)
    ]
    p = run(queue, cards=cards, cpu=cpu, running=running)
    by_id = {c.job_id: c for c in queue}
    # At most one entry per job, and together they cover a prefix of the queue: the scan
    # skips nothing, it only stops early.
    seen = [s.job_id for s in p.starts] + [h.job_id for h in p.holds]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == list(range(len(seen)))
    # No card twice, only healthy idle ones, each with the VRAM the job asked for.
    taken = [g for s in p.starts for g in s.gpus]
    assert len(taken) == len(set(taken))
    for s in p.starts:
        job = by_id[s.job_id]
        assert len(s.gpus) == job.gpus
        for g in s.gpus:
            card = cards[g]
            assert card.healthy and not card.running
            assert card.vram_total_mb - card.vram_used_mb >= (job.vram_mb or 0)
    assert sum(1 for s in p.starts if not s.gpus) <= cpu
    # Host RAM: what starts fits the free figure, unless it is the lone first start.
    free = free_for_new_mb(HOST, running)
    booked = 0
    for s in p.starts:
        mb = by_id[s.job_id].projection
        if mb is not None and (running or booked or s != p.starts[0]):
            assert booked + mb.projected_mb <= free
        booked += mb.projected_mb if mb is not None else 0


# --- which barrier blocks whom, by table ------------------------------------------------


def test_behind_a_starving_cpu_job_gpu_jobs_still_start() -> None:
    # No CPU slot free: the CPU job is held past the limit and becomes the barrier; a
    # GPU job takes nothing it waits for.
    candidates = [cand(1, gpus=0, held_since=NOW - WAIT), cand(2), cand(3, gpus=0)]
    p = run(candidates, cards=idle(0), cpu=0)
    assert p.starts == (Start(2, (0,), 0),)
    assert p.holds == (Hold(1, "cpu", "waiting for a free CPU slot"),)


def test_the_ram_of_a_starving_cpu_job_is_set_aside_from_gpu_jobs() -> None:
    # Free: min(128000 - 10240, 122880) - 6144 = 111616 MB; 100 GB set aside leaves 9 GB.
    cards = [*idle(0, 2), busy_card(1, 9)]
    running = [running_job(9, 10 * GB, 10 * GB, (1,))]
    candidates = [
        cand(1, gpus=0, mb=100 * GB, held_since=NOW - WAIT),
        cand(2, mb=20 * GB),
        cand(3, mb=5 * GB),
    ]
    p = run(candidates, cards=cards, running=running, cpu=0)
    assert p.starts == (Start(3, (0,), 0),)
    assert p.holds == (
        Hold(1, "cpu", "waiting for a free CPU slot"),
        Hold(2, "host_ram", "waiting for host RAM: needs ~20 GiB, ~9 GiB free"),
    )


def test_behind_a_starving_vram_job_gpu_jobs_wait_and_cpu_jobs_run() -> None:
    cards = [Card(0, CARD, 4 * GB, True, ())]  # 20 GB free of 24
    candidates = [
        cand(1, vram_mb=22 * GB, held_since=NOW - WAIT),
        cand(2, vram_mb=1 * GB),
        cand(3, gpus=0),
    ]
    p = run(candidates, cards=cards, cpu=1)
    assert p.starts == (Start(3, (), 0),)
    assert p.holds == (
        Hold(1, "vram", "waiting for VRAM: needs ~22 GiB on one card, ~20 GiB free at most"),
        Hold(2, "vram", "waiting behind job 1, which waits for VRAM"),
    )


def test_a_job_held_just_under_the_limit_is_no_barrier() -> None:
    # Job 2 ends before job 9 does: the reservation lets it pass, and no barrier stops it.
    candidates = [cand(1, gpus=2, held_since=NOW - WAIT + 1), cand(2, time_s=60)]
    running = [running_job(9, None, 1, ends_in_s=3600)]
    p = run(candidates, cards=[*idle(0), busy_card(1, 9)], running=running)
    assert p.starts == (Start(2, (0,), 0),)
    assert [(h.job_id, h.reason) for h in p.holds] == [(1, "gpus")]


def test_a_job_never_held_is_no_barrier() -> None:
    running = [running_job(9, None, 1, ends_in_s=3600)]
    p = run(
        [cand(1, gpus=2), cand(2, time_s=60)], cards=[*idle(0), busy_card(1, 9)], running=running
    )
    assert p.starts == (Start(2, (0,), 0),)


def test_only_the_first_starving_job_is_the_barrier() -> None:
    # Job 1 waits for a CPU slot (GPU jobs pass it); job 2 also starves, for cards, but
    # the barrier is already job 1's, so GPU job 3 still starts.
    cards = [*idle(0), busy_card(1, 9)]
    candidates = [
        cand(1, gpus=0, held_since=NOW - WAIT),
        cand(2, gpus=2, held_since=NOW - WAIT),
        cand(3, time_s=60),  # ends before job 9: job 2's reservation lets it pass
    ]
    running = [running_job(9, None, 1, ends_in_s=3600)]
    p = run(candidates, cards=cards, running=running, cpu=0)
    assert p.starts == (Start(3, (0,), 0),)
    assert [h.job_id for h in p.holds] == [1, 2]


def test_a_vram_request_is_booked_on_each_card_of_a_gang() -> None:
    p = run([cand(1, gpus=2, vram_mb=3 * GB)], cards=idle(0, 1))
    assert p.starts == (Start(1, (0, 1), 3 * GB),)


def test_a_job_with_exactly_the_free_ram_starts() -> None:
    running = [running_job(9, 10 * GB, 10 * GB, (1,))]
    cards = [*idle(0), busy_card(1, 9)]
    p = run([cand(1, mb=111_616)], cards=cards, running=running)
    assert p.starts == (Start(1, (0,), 0),)
    p = run([cand(1, mb=111_617)], cards=cards, running=running)
    assert p.holds == (Hold(1, "host_ram", "waiting for host RAM: needs ~109 GiB, ~109 GiB free"),)


@pytest.mark.parametrize(
    ("limit", "available", "reserve", "running", "free"),
    [
        (100_000, 100_000, 0, [], 100_000),
        (100_000, 100_000, 1_000, [], 99_000),
        (100_000, 50_000, 0, [], 50_000),
        # projected 30000, RSS 10000: the ledger books 30000, the machine still owes 20000
        (100_000, 100_000, 0, [(30_000, 10_000)], 70_000),
        (100_000, 60_000, 0, [(30_000, 10_000)], 40_000),
        # past its projection: RSS counts, nothing more to grow
        (100_000, 100_000, 0, [(30_000, 50_000)], 50_000),
        # no projection: RSS only
        (100_000, 100_000, 0, [(None, 20_000)], 80_000),
        (100_000, 90_000, 500, [(None, 20_000), (40_000, 5_000)], 39_500),
        (10_000, 100_000, 0, [(30_000, 10_000)], -20_000),  # overbooked: negative
    ],
)
def test_free_for_new_by_table(
    limit: int,
    available: int,
    reserve: int,
    running: list[tuple[int | None, int]],
    free: int,
) -> None:
    jobs = [running_job(i, mb, rss) for i, (mb, rss) in enumerate(running)]
    assert free_for_new_mb(HostMemory(limit, available, reserve), jobs) == free


# --- boundaries, each on its own ----------------------------------------------------------


def test_the_machine_view_binds_a_job_past_its_projection_with_no_growth_left() -> None:
    # Ledger: 100000 - 50000 = 50000; machine: 40000 - 0 (no growth left) = 40000.
    host = HostMemory(limit_mb=100_000, available_mb=40_000, reserve_mb=0)
    assert free_for_new_mb(host, [running_job(1, 30_000, 50_000)]) == 40_000


def test_a_job_held_behind_a_barrier_books_no_ram() -> None:
    # Job 1 starves for cards and blocks GPU job 2, whose 100 GB stays unbooked, so CPU
    # job 3 still finds its 20 GB among the 109 GB free.
    cards = [*idle(0), busy_card(1, 9)]
    running = [running_job(9, 10 * GB, 10 * GB, (1,))]
    candidates = [
        cand(1, gpus=2, held_since=NOW - WAIT),
        cand(2, mb=100 * GB),
        cand(3, gpus=0, mb=20 * GB),
    ]
    p = run(candidates, cards=cards, running=running, cpu=1)
    assert p.starts == (Start(3, (), 0),)
    assert [h.job_id for h in p.holds] == [1, 2]


def test_a_cpu_job_reserves_no_vram_whatever_it_asked() -> None:
    p = run([cand(1, gpus=0, vram_mb=GB)], cards=idle(0), cpu=1)
    assert p.starts == (Start(1, (), 0),)


def test_a_job_needing_a_whole_card_can_start_so_it_is_a_barrier() -> None:
    cards = [Card(0, CARD, 1 * GB, True, ())]  # someone outside uses 1 GB of it
    candidates = [cand(1, vram_mb=CARD, held_since=NOW - WAIT), cand(2)]
    p = run(candidates, cards=cards)
    assert p.starts == ()
    assert p.holds[1] == Hold(2, "vram", "waiting behind job 1, which waits for VRAM")


def test_a_job_without_a_projection_books_no_ram() -> None:
    # 111616 MB free; job 1 has no figure, so job 2 may take all of it.
    cards = [*idle(0, 2), busy_card(1, 9)]
    running = [running_job(9, 10 * GB, 10 * GB, (1,))]
    p = run([cand(1), cand(2, mb=111_616)], cards=cards, running=running)
    assert p.starts == (Start(1, (0,), 0), Start(2, (2,), 0))


def test_a_single_gpu_wait_says_gpu() -> None:
    p = run([cand(1)], cards=[busy_card(0, 9)], running=[running_job(9, None, 1)], cpu=1)
    assert p.holds == (Hold(1, "gpus", "waiting for 1 free GPU, 0 free"),)


def test_a_card_used_to_the_last_mb_still_takes_a_job_that_asks_no_vram() -> None:
    p = run([cand(1)], cards=[Card(0, CARD, CARD, True, ())])
    assert p.starts == (Start(1, (0,), 0),)


def test_vram_that_fits_exactly_fits() -> None:
    p = run([cand(1, vram_mb=20 * GB)], cards=[Card(0, CARD, 4 * GB, True, ())])
    assert p.starts == (Start(1, (0,), 20 * GB),)


@pytest.mark.parametrize(
    ("mb", "text"),
    [(10_650, "~10 GiB"), (1_024_000, "~1000 GiB"), (10_240, "~10 GiB"), (1_536, "~1.5 GiB")],
)
def test_gb_by_table(mb: int, text: str) -> None:
    assert gb(mb) == text


def test_a_plan_leaves_nothing_for_the_collector() -> None:
    """A plan a claim, thousands a batch: one that tied its pieces in a cycle left each
    for the collector, whose full passes then walked every queued job to find them."""
    import gc

    wide = [cand(1, gpus=2), cand(2), cand(3, mb=200 * GB), cand(4, time_s=60.0)]
    running = [running_job(9, 8 * GB, 4 * GB, ends_in_s=30.0)]
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            run(wide, cards=[busy_card(0, 9), *idle(1)], running=running)
        assert gc.collect() == 0
    finally:
        gc.enable()
