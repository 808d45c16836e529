"""bench.gap's gaps: per card, from one run's end to the next run's start."""

from __future__ import annotations

import pytest

from bench.gap import gaps, pairs, percentiles


def test_gaps_are_per_card_between_runs_that_follow_each_other() -> None:
    runs = [(0, 3.0, 4.0), (1, 0.5, 2.0), (0, 0.0, 1.0), (1, 2.25, 3.0), (0, 1.5, 2.5)]
    assert sorted(gaps(runs)) == pytest.approx([0.25, 0.5, 0.5])
    assert gaps([(0, 0.0, 1.0)]) == []


def test_percentiles_in_ms() -> None:
    assert percentiles([]) == {"n": 0}
    got = percentiles([i / 1000 for i in range(1, 101)])
    assert got == {"n": 100, "p50": 51.0, "p90": 90.0, "p99": 99.0, "max": 100.0}


def test_a_gap_is_ahead_when_the_next_run_was_claimed_before_the_end() -> None:
    runs = [(0, 0.0, 1.0, 0.0), (0, 1.25, 2.0, 0.5), (0, 2.5, 3.0, 2.25)]
    assert pairs(runs) == [(0.25, True), (0.5, False)]
