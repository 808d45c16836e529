"""Reservations for wide jobs (EASY backfill): the first job of several cards held for
cards keeps the idle cards that fit it, and only a job whose --time ends before it is due
may take them. Each case is a whole admission pass: cards, running jobs, the queue in
order, and what starts, what is held with which words, and which cards stay kept."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.admission import Candidate, Card, HostMemory, Plan, RunningJob, plan
from supervisor.core.jobs import Job, JobSpec
from supervisor.core.records import Attempt, iso_at
from supervisor.core.reservation import Reservation, backfill, reserve, time_left_s
from supervisor.core.table import Live, Phase

GB = 1024
CARD = 24 * GB
HOST = HostMemory(limit_mb=125 * GB, available_mb=120 * GB, reserve_mb=6 * GB)
NOW = 10_000.0
WAIT = 900.0

TWO_NONE = "waiting for 2 free GPUs, 0 free"
TWO_ONE = "waiting for 2 free GPUs, 1 free"
ONE_NONE = "waiting for 1 free GPU, 0 free"
AS_THEY_FREE = "cards reserved for it as they free"
ONLY_BEFORE = "(only a job whose --time ends before its start may use them)"


def due(job: int) -> str:
    return f"the rest due by job {job}'s time limit"


def unknown(job: int) -> str:
    return f"no start estimate (job {job} has no time limit)"


def ends_after(job: int) -> str:
    return f"(its start is due by job {job}'s time limit; --time ends after)"


@dataclass(frozen=True)
class Case:
    cards: int  # cards 0..n-1, 24 GB each
    running: dict[int, tuple[tuple[int, ...], float | None]]  # job -> (cards, ends in s)
    queue: list[Candidate]
    starts: dict[int, tuple[int, ...]]
    holds: dict[int, str]  # job -> waiting_for
    kept: tuple[int, ...] = ()
    vram_used: dict[int, int] = field(default_factory=dict)  # card -> MB used outside gpusv


def c(
    job_id: int,
    gpus: int = 1,
    time_s: float | None = None,
    held_s: float | None = None,
    vram_mb: int | None = None,
    share: bool = False,
    pins: tuple[int, ...] | None = None,
) -> Candidate:
    held = None if held_s is None else NOW - held_s
    return Candidate(
        job_id, gpus, vram_mb, None, held, share=share, cards=pins, time_limit_s=time_s
    )


CASES: dict[str, Case] = {
    "the wide job waits and keeps the card that freed": Case(
        cards=2,
        running={9: ((1,), None)},
        queue=[c(1, gpus=2), c(2)],
        starts={},
        holds={
            1: f"{TWO_ONE}; card 0 reserved for it, {unknown(9)}",
            2: "waiting for card 0, reserved for job 1, which has no start estimate "
            "(job 9 has no time limit)",
        },
        kept=(0,),
    ),
    "a short job backfills onto the kept card": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2), c(2, time_s=600)],
        starts={2: (0,)},
        holds={1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}"},
    ),
    "a job ending exactly when the wide job is due still backfills": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2), c(2, time_s=3600)],
        starts={2: (0,)},
        holds={1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}"},
    ),
    "a long job does not jump it": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2), c(2, time_s=7200)],
        starts={},
        holds={
            1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}",
            2: f"waiting for card 0, reserved for job 1 {ends_after(9)}",
        },
        kept=(0,),
    ),
    "a job without a time limit does not jump it": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2), c(2)],
        starts={},
        holds={
            1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}",
            2: f"waiting for card 0, reserved for job 1 {ONLY_BEFORE}",
        },
        kept=(0,),
    ),
    "the estimate is the card that frees last among those it needs": Case(
        cards=4,
        running={7: ((1,), 600), 8: ((2,), 3600), 9: ((3,), None)},
        # Needs 3: card 0 now, card 1 in 10 min, card 2 in an hour. Card 3 is not needed.
        queue=[c(1, gpus=3), c(2, time_s=1800), c(3, time_s=4000)],
        starts={2: (0,)},
        holds={
            1: f"waiting for 3 free GPUs, 1 free; card 0 reserved for it, {due(8)}",
            3: ONE_NONE,  # the kept card went to job 2
        },
    ),
    "an unlimited job makes the estimate unknown only where its card is needed": Case(
        cards=3,
        running={8: ((1,), 600), 9: ((2,), None)},
        queue=[c(1, gpus=3), c(2, time_s=60)],
        starts={},
        holds={
            1: f"waiting for 3 free GPUs, 1 free; card 0 reserved for it, {unknown(9)}",
            2: "waiting for card 0, reserved for job 1, which has no start estimate "
            "(job 9 has no time limit)",
        },
        kept=(0,),
    ),
    "with no card free, cards are kept for it as they free": Case(
        cards=2,
        running={8: ((0,), 600), 9: ((1,), 1200)},
        queue=[c(1, gpus=2), c(2, time_s=60)],
        starts={},
        holds={1: f"{TWO_NONE}; {AS_THEY_FREE}, enough due by job 9's time limit", 2: ONE_NONE},
    ),
    "only the first wide job has cards kept; the second may backfill": Case(
        cards=3,
        running={9: ((2,), 3600)},
        # Job 1 needs 3 cards: 0 and 1 are kept. Job 2 (2 cards, 30 min) ends before.
        queue=[c(1, gpus=3), c(2, gpus=2, time_s=1800)],
        starts={2: (0, 1)},
        holds={1: f"waiting for 3 free GPUs, 2 free; cards 0,1 reserved for it, {due(9)}"},
    ),
    "a second wide job that would end too late waits for the kept cards": Case(
        cards=3,
        running={9: ((2,), 3600)},
        queue=[c(1, gpus=3), c(2, gpus=2)],
        starts={},
        holds={
            1: f"waiting for 3 free GPUs, 2 free; cards 0,1 reserved for it, {due(9)}",
            2: f"waiting for cards 0,1, reserved for job 1 {ONLY_BEFORE}",
        },
        kept=(0, 1),
    ),
    "priority first: the wide job ahead in the queue order keeps the card": Case(
        cards=2,
        running={9: ((1,), 3600)},
        # The queue comes in order (priority, then id): job 5 was put first.
        queue=[c(5, gpus=2), c(1, gpus=2), c(2)],
        starts={},
        holds={
            5: f"{TWO_ONE}; card 0 reserved for it, {due(9)}",
            1: f"{TWO_NONE}; card 0 reserved for job 5",
            2: f"waiting for card 0, reserved for job 5 {ONLY_BEFORE}",
        },
        kept=(0,),
    ),
    "a one-card job ahead of the wide one takes the free card": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(2), c(1, gpus=2), c(3, time_s=60)],
        starts={2: (0,)},
        # Job 2, started in this pass without a limit, holds a card that job 1 needs.
        holds={1: f"{TWO_NONE}; {AS_THEY_FREE}, {unknown(2)}", 3: ONE_NONE},
    ),
    "a job that could never start keeps nothing": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=3), c(2)],
        starts={2: (0,)},
        holds={1: "waiting for 3 free GPUs, 1 free"},
    ),
    "a card without room for its VRAM is not kept": Case(
        cards=3,
        running={9: ((2,), 3600)},
        vram_used={1: 20 * GB},  # used outside gpusv: card 1 has 4 GB free
        queue=[c(1, gpus=2, vram_mb=10 * GB), c(2, vram_mb=2 * GB)],
        starts={2: (1,)},
        holds={
            1: "waiting for VRAM: needs ~10 GiB on each of 2 cards, 1 have it; "
            f"card 0 reserved for it, {due(9)}"
        },
        kept=(0,),
    ),
    "past the backfill wait the barrier stops even a job that would end before": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2, held_s=WAIT), c(2, time_s=60)],
        starts={},
        holds={
            1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}",
            2: "waiting behind job 1, which waits for free GPUs",
        },
    ),
    "shared jobs do not take a kept card": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2), c(2, vram_mb=1 * GB, share=True, time_s=60)],
        starts={},
        holds={
            1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}",
            2: "waiting for VRAM: needs ~1 GiB, at most ~0 GiB free on any card",
        },
        kept=(0,),
    ),
    # --- pinned jobs (--cards): only their own cards count ------------------------------
    "a pinned wide job keeps only its own cards, and its estimate counts only those": Case(
        cards=4,
        running={8: ((3,), None), 9: ((1,), 3600)},
        # Pinned to 1 and 2: card 2 is kept, card 0 is not; job 8's card is not its own,
        # so its missing limit leaves the estimate alone.
        queue=[c(1, gpus=2, pins=(1, 2)), c(2)],
        starts={2: (0,)},
        holds={
            1: "waiting for its cards (cards 1, 2): needs 2 free GPUs, 1 free; "
            f"card 2 reserved for it, {due(9)}"
        },
        kept=(2,),
    ),
    "a pinned short job backfills onto a kept card among its own": Case(
        cards=3,
        running={9: ((2,), 3600)},
        queue=[c(1, gpus=3), c(2, pins=(1, 2), time_s=600)],
        starts={2: (1,)},
        holds={1: f"waiting for 3 free GPUs, 2 free; cards 0,1 reserved for it, {due(9)}"},
        kept=(0,),
    ),
    "a pinned job without --time waits for the kept card among its own": Case(
        cards=3,
        running={9: ((2,), 3600)},
        queue=[c(1, gpus=3), c(2, pins=(1, 2))],
        starts={},
        holds={
            1: f"waiting for 3 free GPUs, 2 free; cards 0,1 reserved for it, {due(9)}",
            2: f"waiting for card 1, reserved for job 1 {ONLY_BEFORE}",
        },
        kept=(0, 1),
    ),
    "a pinned job never takes a kept card outside its own": Case(
        cards=3,
        running={9: ((2,), 3600)},
        queue=[c(1, gpus=3), c(2, pins=(2,), time_s=60)],
        starts={},
        holds={
            1: f"waiting for 3 free GPUs, 2 free; cards 0,1 reserved for it, {due(9)}",
            2: "waiting for its cards (card 2): needs 1 free GPU, 0 free",
        },
        kept=(0, 1),
    ),
    "a pinned job that the kept cards would not fit is told of its own only": Case(
        cards=4,
        running={9: ((3,), 3600)},
        queue=[c(1, gpus=4), c(2, gpus=2, pins=(0, 3), time_s=60)],
        starts={},
        holds={
            1: f"waiting for 4 free GPUs, 3 free; cards 0,1,2 reserved for it, {due(9)}",
            2: "waiting for its cards (cards 0, 3): needs 2 free GPUs, 0 free; "
            "card 0 reserved for job 1",
        },
        kept=(0, 1, 2),
    ),
    "a short job backfills onto a card kept for a pinned wide job": Case(
        cards=3,
        running={8: ((2,), None), 9: ((1,), 3600)},  # card 2 is not its own
        queue=[c(1, gpus=2, pins=(0, 1)), c(2, time_s=600)],
        starts={2: (0,)},
        holds={
            1: "waiting for its cards (cards 0, 1): needs 2 free GPUs, 1 free; "
            f"card 0 reserved for it, {due(9)}"
        },
    ),
    "CPU jobs pass it": Case(
        cards=2,
        running={9: ((1,), 3600)},
        queue=[c(1, gpus=2), c(2, gpus=0)],
        starts={2: ()},
        holds={1: f"{TWO_ONE}; card 0 reserved for it, {due(9)}"},
        kept=(0,),
    ),
}


def run(case: Case) -> Plan:
    busy = {card: job for job, (cards, _) in case.running.items() for card in cards}
    cards = [
        Card(
            i,
            CARD,
            case.vram_used.get(i, 0),
            True,
            (busy[i],) if i in busy else (),
        )
        for i in range(case.cards)
    ]
    running = [
        RunningJob(job, None, 0, cards_of, 0, ends_in_s=ends)
        for job, (cards_of, ends) in case.running.items()
    ]
    return plan(
        case.queue,
        cards=cards,
        cpu_slots_free=1,
        host=HOST,
        running=running,
        now=NOW,
        max_backfill_wait_s=WAIT,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_reservation(name: str) -> None:
    case = CASES[name]
    p = run(case)
    assert {s.job_id: s.gpus for s in p.starts} == case.starts
    assert {h.job_id: h.message for h in p.holds} == case.holds
    assert p.reserved == case.kept
    pinned = {cand.job_id for cand in case.queue if cand.cards is not None}
    assert all(h.reason == "cards" for h in p.holds if h.job_id in pinned)


def test_the_reservation_follows_the_cards_as_they_free() -> None:
    """Pass after pass, each freed card is kept until the wide job has enough."""
    queue = [c(1, gpus=3), c(2)]
    first = run(Case(3, {8: ((1,), 60), 9: ((2,), 120)}, queue, {}, {}))
    assert first.reserved == (0,) and not first.starts
    second = run(Case(3, {9: ((2,), 60)}, queue, {}, {}))
    assert second.reserved == (0, 1) and not second.starts
    third = run(Case(3, {}, queue, {}, {}))
    assert [(s.job_id, s.gpus) for s in third.starts] == [(1, (0, 1, 2))]
    assert [h.message for h in third.holds] == [ONE_NONE]


# --- the pieces -----------------------------------------------------------------------


def test_admits_only_a_time_that_ends_before_a_known_start() -> None:
    known = Reservation(1, (0,), 600.0, 9)
    assert known.admits(600) and known.admits(1) and not known.admits(601)
    assert not known.admits(None)
    assert not Reservation(1, (0,), None, 9).admits(1)
    assert not Reservation(1, (0,), 0.0, 9).may_backfill()


def test_a_job_started_in_the_same_pass_counts_towards_the_estimate() -> None:
    cand = c(1, gpus=2)
    cards = [Card(0, CARD, 0, True, ()), Card(1, CARD, 0, True, ())]
    res = reserve(cand, {}, cards, [], {0: (300.0, 5), 1: (None, 6)})
    assert (res.cards, res.start_in_s, res.due_to) == ((), None, 6)
    res = reserve(cand, {}, cards, [], {0: (300.0, 5), 1: (200.0, 6)})
    assert (res.start_in_s, res.due_to) == (300.0, 5)


def test_an_overdue_job_gives_a_start_of_now() -> None:
    cards = [Card(0, CARD, 0, True, ()), Card(1, CARD, 0, True, (9,))]
    running = [RunningJob(9, None, 0, (1,), 0, ends_in_s=0.0)]
    res = reserve(c(1, gpus=2), {0: CARD}, cards, running, {})
    assert res.start_in_s == 0.0 and not res.may_backfill()


def test_backfill_puts_a_job_on_kept_cards_first() -> None:
    res = Reservation(1, (0,), 600.0, 9)
    assert backfill(res, {0: CARD}, {3: CARD}, c(2, gpus=2, time_s=60), "gpus", "m") == (0, 3)
    assert backfill(res, {0: CARD}, {3: CARD}, c(2, gpus=1, time_s=60), "gpus", "m") == (0,)


def spec(limit: float | None) -> JobSpec:
    return JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0, time_limit_s=limit)


def live(job_id: int, started: float, after: tuple[int, int] | None = None) -> Live:
    attempt = Attempt(job_id=job_id, n=1, gpus=(0,), started_at=iso_at(started), mem_key="k")
    phase = Phase.CLAIMED if after else Phase.RUNNING
    return Live(attempt, (0,), job_id, phase, None, 0, 0.0, after=after)


def test_time_left_counts_from_the_start_and_through_a_line() -> None:
    wall = 1_800_000_000.0
    lives = {1: live(1, wall - 100), 2: live(2, wall, after=(1, 1))}
    jobs = {1: Job(id=1, spec=spec(600)), 2: Job(id=2, spec=spec(60))}
    assert time_left_s(1, lives, jobs, wall) == pytest.approx(500)
    assert time_left_s(2, lives, jobs, wall) == pytest.approx(560)  # after job 1's end
    assert time_left_s(1, lives, jobs, wall + 1000) == 0.0  # overdue: being stopped
    jobs[1] = Job(id=1, spec=spec(None))
    assert time_left_s(1, lives, jobs, wall) is None
    assert time_left_s(2, lives, jobs, wall) is None


# --- what it promises -----------------------------------------------------------------

_ends = st.one_of(st.none(), st.floats(min_value=0, max_value=10_000))
_limits = st.one_of(st.none(), st.floats(min_value=1, max_value=10_000))
_pins = st.none() | st.sets(st.integers(0, 6), min_size=1).map(lambda s: tuple(sorted(s)))


@given(
    busy=st.lists(_ends, min_size=1, max_size=4),
    idle=st.integers(min_value=0, max_value=3),
    wide=st.integers(min_value=2, max_value=5),
    later=st.lists(st.tuples(st.integers(min_value=1, max_value=2), _limits, _pins), max_size=6),
)
def test_nothing_that_takes_a_kept_card_ends_after_the_wide_job_is_due(
    busy: list[float | None],
    idle: int,
    wide: int,
    later: list[tuple[int, float | None, tuple[int, ...] | None]],
) -> None:
    """Whatever runs and waits: the first wide job keeps every idle card it could use, a
    job that starts on one has a --time that ends by its estimated start, and a pinned
    job starts only on its own cards."""
    running: dict[int, tuple[tuple[int, ...], float | None]] = {
        100 + i: ((idle + i,), ends) for i, ends in enumerate(busy)
    }
    queue = [c(1, gpus=wide)] + [
        c(2 + i, gpus=g, time_s=t, pins=pins) for i, (g, t, pins) in enumerate(later)
    ]
    case = Case(idle + len(busy), running, queue, {}, {})
    p = run(case)
    pins_of = {cand.job_id: cand.cards for cand in queue}
    for start in p.starts:
        pins = pins_of[start.job_id]
        assert pins is None or set(start.gpus) <= set(pins)
    if wide > case.cards:  # it could never start (a later wide job may keep cards instead)
        return
    if wide <= idle:
        assert p.starts[0].job_id == 1
        return
    cards = [Card(i, CARD, 0, True, ()) for i in range(idle)] + [
        Card(idle + i, CARD, 0, True, (100 + i,)) for i in range(len(busy))
    ]
    jobs = [RunningJob(j, None, 0, g, 0, ends_in_s=e) for j, (g, e) in running.items()]
    res = reserve(queue[0], {i: CARD for i in range(idle)}, cards, jobs, {})
    assert res.cards == tuple(range(idle))
    limits = {cand.job_id: cand.time_limit_s for cand in queue}
    for start in p.starts:
        if set(start.gpus) & set(res.cards):
            limit = limits[start.job_id]
            assert limit is not None and res.start_in_s is not None
            assert limit <= res.start_in_s
    left = set(res.cards) - {card for s in p.starts for card in s.gpus}
    assert set(p.reserved) == left
