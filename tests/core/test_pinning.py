"""Jobs pinned to cards: admission places them on their own cards only, says when they
wait for those, and never lets a pin turn into a barrier it could not lift; and what a
submit's --cards / --not-cards resolve to."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core import pinning
from supervisor.core.admission import (
    Candidate,
    Card,
    Hold,
    HostMemory,
    Plan,
    Start,
    could_run,
    plan,
)

GB = 1024
HOST = HostMemory(limit_mb=125 * GB, available_mb=120 * GB, reserve_mb=6 * GB)
NOW, WAIT = 10_000.0, 900.0


def cards(*busy: int, n: int = 4, sizes: dict[int, int] | None = None) -> list[Card]:
    sizes = sizes or {}
    return [
        Card(i, sizes.get(i, 24 * GB), 0, True, (100 + i,) if i in busy else ()) for i in range(n)
    ]


def pinned(
    job_id: int,
    pins: tuple[int, ...] | None,
    gpus: int = 1,
    vram_mb: int | None = None,
    held_since: float | None = None,
) -> Candidate:
    return Candidate(job_id, gpus, vram_mb, None, held_since, cards=pins)


def run(cands: list[Candidate], on: list[Card]) -> Plan:
    return plan(
        cands,
        cards=on,
        cpu_slots_free=0,
        host=HOST,
        running=(),
        now=NOW,
        max_backfill_wait_s=WAIT,
    )


def test_a_pinned_job_goes_on_its_own_card_though_a_lower_one_is_free() -> None:
    assert run([pinned(1, (2,))], cards()).starts == (Start(1, (2,), 0),)


def test_a_pinned_job_chooses_gpus_of_its_cards() -> None:
    out = run([pinned(1, (1, 2, 3), gpus=2)], cards(2))
    assert out.starts == (Start(1, (1, 3), 0),)


def test_a_pinned_job_waits_for_its_cards_while_others_are_free_and_later_jobs_pass() -> None:
    out = run([pinned(1, (0, 1), gpus=2), pinned(2, None)], cards(1))
    waits = "waiting for its cards (cards 0, 1): needs 2 free GPUs, 1 free"
    kept = "card 0 reserved for it, no start estimate (job 101 has no time limit)"
    assert out.holds == (Hold(1, "cards", f"{waits}; {kept}"),)
    assert out.starts == (Start(2, (2,), 0),)  # card 0 is kept for job 1


def test_a_pinned_job_held_for_vram_on_its_cards_says_so() -> None:
    out = run([pinned(1, (0,), vram_mb=30 * GB)], cards(sizes={0: 24 * GB, 1: 48 * GB}))
    (hold,) = out.holds
    assert hold == Hold(
        1, "cards", "waiting for its cards (card 0): needs ~30 GiB of VRAM on 1, 0 have it"
    )


def test_not_pinned_keeps_the_old_placement() -> None:
    assert run([pinned(1, None)], cards(0)).starts == (Start(1, (1,), 0),)


def test_a_shared_pinned_job_shares_only_its_own_cards() -> None:
    cand = Candidate(1, 1, 4 * GB, None, None, share=True, cards=(3,))
    assert run([cand], cards()).starts == (Start(1, (3,), 4 * GB),)
    cand = Candidate(1, 1, 40 * GB, None, None, share=True, cards=(3,))
    (hold,) = run([cand], cards()).holds
    assert hold.reason == "vram" and hold.message.endswith("free on its card 3")


def test_a_starving_pinned_job_is_a_barrier_for_gpu_jobs() -> None:
    out = run([pinned(1, (0,), held_since=0.0), pinned(2, None)], cards(0))
    assert [h.job_id for h in out.holds] == [1, 2] and out.starts == ()
    assert out.holds[1].message == "waiting behind job 1, which waits for its cards"


def test_a_job_pinned_to_lost_cards_is_no_barrier() -> None:
    on = cards(n=2)
    on[0] = Card(0, 24 * GB, 0, False, ())
    out = run([pinned(1, (0,), held_since=0.0), pinned(2, None)], on)
    assert out.starts == (Start(2, (1,), 0),)
    assert not could_run(1, None, on, (0,)) and could_run(1, None, on, (0, 1))


def test_resolve_cards_and_not_cards() -> None:
    known = range(4)
    assert pinning.resolve(None, None, known) is None
    assert pinning.resolve([3, 0], None, known) == (0, 3)
    assert pinning.resolve(None, [1], known) == (0, 2, 3)
    assert pinning.resolve([0, 1, 2], [1], known) == (0, 2)
    with pytest.raises(ValueError, match="--cards: no card 7; this machine has cards 0, 1, 2, 3"):
        pinning.resolve([7], None, known)
    with pytest.raises(ValueError, match="--not-cards: no card 9"):
        pinning.resolve(None, [9], known)
    with pytest.raises(ValueError, match="leave no card"):
        pinning.resolve([1], [1], known)
    with pytest.raises(ValueError, match="no GPU"):
        pinning.resolve([0], None, range(0))


def test_refusal() -> None:
    assert pinning.refusal(2, None) is None
    assert pinning.refusal(2, (0, 1)) is None
    assert pinning.refusal(3, (0, 1)) == "asks for 3 GPUs but may use only 2 (cards 0, 1)"
    assert "--gpus 0" in (pinning.refusal(0, (0,)) or "")


@given(
    busy=st.sets(st.integers(0, 3)),
    jobs=st.lists(
        st.tuples(
            st.integers(1, 3),
            st.none() | st.sets(st.integers(0, 3), min_size=1).map(lambda s: tuple(sorted(s))),
        ),
        max_size=6,
    ),
)
def test_no_job_ever_lands_off_its_cards_and_no_card_is_given_twice(
    busy: set[int], jobs: list[tuple[int, tuple[int, ...] | None]]
) -> None:
    cands = [pinned(i + 1, pins, gpus=n) for i, (n, pins) in enumerate(jobs)]
    out = run(cands, cards(*busy))
    given_out: list[int] = []
    for start in out.starts:
        gpus, pins = jobs[start.job_id - 1]
        assert len(start.gpus) == gpus and not set(start.gpus) & busy
        assert pins is None or set(start.gpus) <= set(pins)
        given_out += start.gpus
    assert len(given_out) == len(set(given_out))
    for hold in out.holds:
        assert (hold.reason == "cards") == (jobs[hold.job_id - 1][1] is not None)
    if out.reserved:  # kept for the first wide job held that could run, among its own
        on = cards(*busy)
        wide = [jobs[h.job_id - 1] for h in out.holds if jobs[h.job_id - 1][0] > 1]
        _, pins = next(j for j in wide if could_run(j[0], None, on, j[1]))
        assert pins is None or set(out.reserved) <= set(pins)
