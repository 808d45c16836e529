"""Shared cards in admission: several shared jobs to a card while their VRAM fits what
is free there, best fit, and never beside a whole-card job."""

from __future__ import annotations

from collections.abc import Sequence

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
    plan,
)

GB = 1024
CARD = 24 * GB
HOST = HostMemory(limit_mb=125 * GB, available_mb=120 * GB, reserve_mb=6 * GB)


def shared(job_id: int, vram_gb: float) -> Candidate:
    return Candidate(job_id, 1, int(vram_gb * GB), None, None, share=True)


def whole(job_id: int) -> Candidate:
    return Candidate(job_id, 1, None, None, None)


def card(index: int, *running: int, used_gb: float = 0) -> Card:
    return Card(index, CARD, int(used_gb * GB), True, running)


def busy(job_id: int, gpu: int, vram_gb: float, *, is_shared: bool = True) -> RunningJob:
    return RunningJob(job_id, None, 0, (gpu,), int(vram_gb * GB), shared=is_shared)


def run(
    candidates: Sequence[Candidate],
    cards: Sequence[Card],
    running: Sequence[RunningJob] = (),
) -> Plan:
    return plan(
        candidates,
        cards=cards,
        cpu_slots_free=0,
        host=HOST,
        running=running,
        now=0.0,
        max_backfill_wait_s=900.0,
    )


def placed(p: Plan) -> dict[int, tuple[int, ...]]:
    return {s.job_id: s.gpus for s in p.starts}


def test_six_seven_gig_jobs_go_three_to_a_card() -> None:
    p = run([shared(i, 7) for i in range(1, 8)], [card(0), card(1)])
    where = placed(p)
    assert sorted(where.values()).count((0,)) == 3
    assert sorted(where.values()).count((1,)) == 3
    assert [h.job_id for h in p.holds] == [7]
    assert p.holds[0].reason == "vram"
    assert p.holds[0].message == "waiting for VRAM: needs ~7 GiB, at most ~3 GiB free on any card"


def test_packs_onto_a_shared_card_before_taking_an_idle_one() -> None:
    p = run([shared(2, 6)], [card(0), card(1, 1)], [busy(1, 1, 6)])
    assert p.starts == (Start(2, (1,), 6 * GB),)


def test_best_fit_among_shared_cards() -> None:
    cards = [card(0, 1), card(1, 2)]
    running = [busy(1, 0, 4), busy(2, 1, 14)]
    p = run([shared(3, 8)], cards, running)
    assert placed(p) == {3: (1,)}  # 10 GB left there beats 20 GB


def test_live_use_by_others_counts_when_it_exceeds_the_reservations() -> None:
    p = run([shared(1, 7)], [card(0, used_gb=20), card(1, used_gb=20)])
    assert p.starts == ()
    assert p.holds[0].message.startswith("waiting for VRAM: needs ~7 GiB, at most ~4 GiB")


def test_reservations_count_when_they_exceed_live_use() -> None:
    running = [busy(1, 0, 10), busy(2, 0, 10)]
    p = run([shared(3, 5)], [card(0, 1, 2, used_gb=3)], running)
    assert p.starts == ()
    assert p.holds[0].reason == "vram"


def test_a_whole_card_job_never_joins_shared_jobs_and_says_why() -> None:
    p = run([whole(5)], [card(0, 1), card(1, 2)], [busy(1, 0, 2), busy(2, 1, 2)])
    assert p.starts == ()
    assert p.holds == (
        Hold(5, "gpus", "waiting for 1 free GPU, 0 free (cards 0, 1 run shared jobs)"),
    )


def test_a_shared_job_never_joins_a_whole_card_job() -> None:
    p = run([shared(2, 1)], [card(0, 1)], [busy(1, 0, 0, is_shared=False)])
    assert p.starts == ()  # no card has room: the scan ends before it
    p = run(
        [shared(2, 1)], [card(0, 1), card(1, 3)], [busy(1, 0, 0, is_shared=False), busy(3, 1, 23.5)]
    )
    assert p.holds == (
        Hold(2, "vram", "waiting for VRAM: needs ~1 GiB, at most ~0.5 GiB free on any card"),
    )


def test_an_unhealthy_card_takes_no_shared_job() -> None:
    p = run([shared(1, 1)], [Card(0, CARD, 0, False, ())])
    assert p.starts == ()


def test_whole_card_job_takes_the_idle_card_beside_shared_ones() -> None:
    p = run([whole(3), shared(4, 2)], [card(0, 1), card(1)], [busy(1, 0, 2)])
    assert placed(p) == {3: (1,), 4: (0,)}


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([12, 12, 12, 12], {1: (0,), 2: (0,), 3: (1,), 4: (1,)}),
        ([20, 4, 4], {1: (0,), 2: (0,), 3: (1,)}),
        ([4, 21, 4], {1: (0,), 2: (1,), 3: (0,)}),
    ],
)
def test_packing_table(sizes: list[int], expected: dict[int, tuple[int, ...]]) -> None:
    p = run([shared(i, gb) for i, gb in enumerate(sizes, 1)], [card(0), card(1)])
    assert placed(p) == expected


job = st.tuples(st.booleans(), st.integers(1, 30))  # (shared, VRAM in GB)


@given(
    st.lists(job, max_size=12),
    st.lists(st.integers(0, 24), min_size=1, max_size=4),
    st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=3),
)
def test_no_card_is_overbooked_or_mixed(
    jobs: list[tuple[bool, int]], used: list[int], already: list[tuple[bool, int]]
) -> None:
    cards, running = [], []
    for i, u in enumerate(used):
        here = [(100 + i * 10 + k, s, v) for k, (s, v) in enumerate(already) if k % len(used) == i]
        cards.append(card(i, *(j for j, _, _ in here), used_gb=u))
        running += [busy(j, i, v, is_shared=s) for j, s, v in here]
    cands = [
        shared(i, v) if s else Candidate(i, 1, v * GB, None, None)
        for i, (s, v) in enumerate(jobs, 1)
    ]
    p = run(cands, cards, running)
    is_shared = {c.job_id: c.share for c in cands} | {r.job_id: r.shared for r in running}
    booked = {r.job_id: r.vram_reserved_mb for r in running}
    on: dict[int, list[int]] = {c.index: list(c.running) for c in cards}
    for s in p.starts:
        booked[s.job_id] = s.vram_reserved_mb
        on[s.gpus[0]].append(s.job_id)
    for c in cards:
        jobs_here = on[c.index]
        new = [j for j in jobs_here if j not in c.running]
        if not new:
            continue
        if len(jobs_here) > 1:
            assert all(is_shared[j] for j in jobs_here)  # nobody shares with a whole-card job
        if any(is_shared[j] for j in new):
            assert sum(booked[j] for j in new) <= CARD - max(
                c.vram_used_mb, sum(booked[j] for j in c.running)
            )
