from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.projection import MemObservation, Projection, project

GB = 1024


def ok(peak: int, scale: float | None = None) -> MemObservation:
    return MemObservation(peak, None, scale)


def failed(peak: int, reason: str, scale: float | None = None) -> MemObservation:
    return MemObservation(peak, reason, scale)


# --- projections ----------------------------------------------------------------------


def test_no_history_and_nothing_declared_is_no_figure() -> None:
    assert project([], declared_mb=None, scale=None, margin=0.05) is None


def test_declared_when_there_is_no_history() -> None:
    assert project([], declared_mb=8000, scale=None, margin=0.05) == Projection(8000, "declared", 0)


def test_a_declared_figure_above_the_history_wins_and_names_the_runs_behind_it() -> None:
    # The user says this run is bigger: 64 GiB declared over runs that peaked at 727 MiB.
    p = project([ok(700), ok(727)], declared_mb=65_536, scale=None, margin=0.05)
    assert p == Projection(65_536, "declared", 2)
    assert p is not None and p.peak_mb == 727


def test_a_declared_figure_below_the_history_loses_to_it() -> None:
    p = project([ok(50_000)], declared_mb=10_000, scale=None, margin=0.0)
    assert p == Projection(50_000, "observed", 1)
    assert p is not None and p.peak_mb == 50_000
    # a tie names the evidence
    assert project([ok(50_000)], declared_mb=50_000, scale=None, margin=0.0) == p


def test_a_declared_figure_is_compared_with_the_fit() -> None:
    history = [ok(1000, scale=1.0), ok(2000, scale=2.0)]
    assert project(history, declared_mb=9000, scale=4.0, margin=0.0) == Projection(
        9000, "declared", 2
    )
    assert project(history, declared_mb=3000, scale=4.0, margin=0.0) == Projection(4000, "fit", 2)


def test_the_json_names_the_peak_behind_the_figure() -> None:
    p = project([ok(1000)], declared_mb=None, scale=None, margin=0.05)
    assert p is not None
    assert p.to_json() == {"projected_mb": 1050, "basis": "observed", "runs": 1, "peak_mb": 1000}
    declared = project([], declared_mb=8000, scale=None, margin=0.05)
    assert declared is not None and declared.to_json()["peak_mb"] is None


def test_observed_is_the_highest_recent_peak_plus_margin() -> None:
    p = project([ok(1000), ok(3000), ok(2000)], declared_mb=None, scale=None, margin=0.05)
    assert p == Projection(3150, "observed", 3)


def test_margin_rounding_adds_no_float_noise() -> None:
    p = project([ok(1000)], declared_mb=None, scale=None, margin=0.05)
    assert p is not None and p.projected_mb == 1050


def test_only_the_last_ten_qualifying_runs_count() -> None:
    history = [ok(90_000)] + [ok(10_000)] * 10
    p = project(history, declared_mb=None, scale=None, margin=0.0)
    assert p == Projection(10_000, "observed", 11)


@pytest.mark.parametrize(
    "reason", ["exit_nonzero", "cancelled", "interrupted", "gpu_hang", "signal", "spawn_failed"]
)
def test_cut_short_runs_never_feed_the_figure(reason: str) -> None:
    p = project([ok(1000), failed(90_000, reason)], declared_mb=None, scale=None, margin=0.0)
    assert p == Projection(1000, "observed", 1)


def test_an_oom_kill_raises_the_floor_a_failed_run_does_not() -> None:
    history = [ok(1000), failed(3000, "oom_killed"), failed(9000, "exit_nonzero")]
    assert project(history, declared_mb=None, scale=None, margin=0.0) == Projection(
        3000, "observed", 1
    )


def test_cut_short_runs_alone_give_no_figure() -> None:
    history = [failed(90_000, "cancelled"), failed(50_000, "gpu_hang")]
    assert project(history, declared_mb=None, scale=None, margin=0.0) is None


def test_an_oom_kill_is_a_floor_over_observed() -> None:
    history = [ok(20_000), failed(60_000, "oom_killed"), ok(30_000)]
    p = project(history, declared_mb=None, scale=None, margin=0.0)
    assert p == Projection(60_000, "observed", 2)


def test_an_oom_kill_is_a_floor_over_declared() -> None:
    p = project([failed(60_000, "oom_killed")], declared_mb=10_000, scale=None, margin=0.1)
    assert p == Projection(66_000, "declared", 0)


def test_an_oom_kill_alone_still_gives_a_figure() -> None:
    p = project([failed(60_000, "oom_killed")], declared_mb=None, scale=None, margin=0.0)
    assert p == Projection(60_000, "observed", 0)


def test_runs_at_the_requested_scale_are_observed() -> None:
    history = [ok(10_000, 1.0), ok(40_000, 4.0), ok(12_000, 1.0)]
    p = project(history, declared_mb=None, scale=1.0, margin=0.0)
    assert p == Projection(12_000, "observed", 2)


def test_fit_through_two_scales() -> None:
    # 2 GB fixed + 10 GB per unit of scale, exactly on a line: no residual.
    history = [ok(12 * GB, 1.0), ok(22 * GB, 2.0), ok(42 * GB, 4.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(32 * GB, "fit", 3)


def test_fit_adds_the_largest_residual_and_margin() -> None:
    # Points (1, 10), (2, 30), (3, 20): line y = 10 + 5x, residuals -5, 10, -5.
    history = [ok(10_000, 1.0), ok(30_000, 2.0), ok(20_000, 3.0)]
    p = project(history, declared_mb=None, scale=5.0, margin=0.1)
    assert p == Projection(round((10_000 + 5_000 * 5 + 10_000) * 1.1), "fit", 3)


def test_one_other_scale_grows_proportionally_up_and_never_shrinks_down() -> None:
    history = [ok(10_000, 2.0)]
    up = project(history, declared_mb=None, scale=3.0, margin=0.0)
    down = project(history, declared_mb=None, scale=1.0, margin=0.0)
    assert up == Projection(15_000, "fit", 1)
    assert down == Projection(10_000, "fit", 1)


def test_memory_that_does_not_grow_with_scale_projects_the_largest_peak() -> None:
    history = [ok(30_000, 1.0), ok(20_000, 2.0)]
    p = project(history, declared_mb=None, scale=8.0, margin=0.0)
    assert p == Projection(30_000, "fit", 2)


def test_a_scale_on_a_job_with_only_unscaled_history_uses_that_history() -> None:
    p = project([ok(7000)], declared_mb=None, scale=2.0, margin=0.0)
    assert p == Projection(7000, "observed", 1)


def test_an_oom_kill_at_a_larger_scale_does_not_bind_a_smaller_one() -> None:
    history = [ok(10_000, 1.0), failed(80_000, "oom_killed", 8.0)]
    assert project(history, declared_mb=None, scale=1.0, margin=0.0) == Projection(
        10_000, "observed", 1
    )
    assert project(history, declared_mb=None, scale=8.0, margin=0.0) == Projection(80_000, "fit", 1)


def test_to_json_matches_the_contract() -> None:
    assert Projection(93_000, "observed", 4, 88_000).to_json() == {
        "projected_mb": 93_000,
        "basis": "observed",
        "runs": 4,
        "peak_mb": 88_000,
    }


observations = st.builds(
    MemObservation,
    peak_rss_mb=st.integers(0, 200_000),
    reason=st.sampled_from(
        [None, "exit_nonzero", "oom_killed", "cancelled", "interrupted", "gpu_hang", "signal"]
    ),
    scale=st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0, 4.0])),
)


@given(
    st.lists(observations, max_size=30),
    st.one_of(st.none(), st.integers(0, 200_000)),
    st.one_of(st.none(), st.sampled_from([0.5, 1.0, 3.0])),
    st.floats(0.0, 0.5),
)
def test_never_below_an_oom_kill_nor_a_recent_qualifying_peak_at_the_same_scale(
    history: list[MemObservation], declared: int | None, scale: float | None, margin: float
) -> None:
    p = project(history, declared_mb=declared, scale=scale, margin=margin)
    binding_ooms = [
        h.peak_rss_mb
        for h in history
        if h.reason == "oom_killed" and (scale is None or h.scale is None or h.scale <= scale)
    ]
    same = [
        h.peak_rss_mb for h in history if h.reason is None and (scale is None or h.scale == scale)
    ]
    if binding_ooms or same or declared is not None:
        assert p is not None
    if p is None:
        return
    assert p.projected_mb >= max(binding_ooms, default=0)
    assert p.projected_mb >= max(same[-10:], default=0)
    assert p.runs >= 0


# --- recency and scale, by table ---------------------------------------------------------


def test_the_fit_keeps_the_ten_newest_peaks_of_each_scale() -> None:
    # Scale 1: two old heavy runs, then ten at 10 GB; scale 2: one at 20 GB. The newest
    # ten at scale 1 lie on y = 10000 x with scale 2, so at scale 3 the fit is 30000.
    # Keeping the oldest ten instead would bring in the 50000s.
    history = [ok(50_000, 1.0)] * 2 + [ok(10_000, 1.0)] * 10 + [ok(20_000, 2.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(30_000, "fit", 11)


def test_the_fit_window_is_per_scale_not_over_all_runs() -> None:
    # Eleven runs at scale 2 after the only run at scale 1: a window over all runs would
    # drop the scale-1 run and leave one scale (a proportional guess, 30000 at scale 3).
    history = [ok(10_000, 1.0)] + [ok(20_000, 2.0)] * 11
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(30_000, "fit", 11)
    # ...and with the scale-1 run gone, the single-scale rule gives the same 30000 from
    # 20000 * 3/2: what differs is the count of points.
    alone = project([ok(20_000, 2.0)] * 11, declared_mb=None, scale=3.0, margin=0.0)
    assert alone == Projection(30_000, "fit", 10)


def test_the_newest_ten_runs_at_the_same_scale_count() -> None:
    history = [ok(90_000, 2.0)] + [ok(10_000, 2.0)] * 10 + [ok(5_000, 1.0)]
    p = project(history, declared_mb=None, scale=2.0, margin=0.0)
    assert p == Projection(10_000, "observed", 11)


def test_a_scale_within_float_noise_is_the_same_scale() -> None:
    history = [ok(10_000, 0.1 + 0.2), ok(40_000, 4.0)]
    p = project(history, declared_mb=None, scale=0.3, margin=0.0)
    assert p == Projection(10_000, "observed", 1)


def test_two_scales_within_float_noise_are_one_point_group_in_the_fit() -> None:
    # 0.1 + 0.2 and 0.3 are one scale: with 2.0 that is two scales, a line through
    # (0.3, 3000) and (2.0, 20000): y = 10000 x, so 30000 at 3.0.
    history = [ok(3_000, 0.1 + 0.2), ok(3_000, 0.3), ok(20_000, 2.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(30_000, "fit", 3)


def test_unscaled_runs_are_left_out_of_a_fit() -> None:
    history = [ok(90_000), ok(10_000, 1.0), ok(20_000, 2.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(30_000, "fit", 2)


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_a_non_positive_scale_uses_every_qualifying_run(scale: float) -> None:
    history = [ok(10_000, 1.0), ok(40_000, 4.0)]
    p = project(history, declared_mb=None, scale=scale, margin=0.0)
    assert p == Projection(40_000, "observed", 2)


def test_runs_with_a_non_positive_scale_are_left_out_of_a_fit() -> None:
    history = [ok(99_000, 0.0), ok(10_000, 1.0), ok(20_000, 2.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(30_000, "fit", 2)


def test_the_fit_extrapolates_downwards_along_a_growing_line() -> None:
    # Points (1, 10000), (2, 10100), (3, 10200): y = 9900 + 100 x.
    history = [ok(10_000, 1.0), ok(10_100, 2.0), ok(10_200, 3.0)]
    p = project(history, declared_mb=None, scale=0.5, margin=0.0)
    assert p == Projection(9_950, "fit", 3)


def test_the_fit_never_goes_below_zero() -> None:
    # Points (1, 1000), (2, 11000): y = -9000 + 10000 x, which is negative at 0.5.
    history = [ok(1_000, 1.0), ok(11_000, 2.0)]
    p = project(history, declared_mb=None, scale=0.5, margin=0.0)
    assert p == Projection(0, "fit", 2)


@pytest.mark.parametrize(
    ("scale", "floor"),
    [
        (1.0, 30_000),  # only the kill at scale 1 and the unscaled one bind
        (2.0, 60_000),  # the kill at scale 2 binds scale 2
        (4.0, 60_000),  # ...and every larger scale
        (None, 60_000),  # no scale: every kill binds
    ],
)
def test_which_oom_kills_bind_which_scale(scale: float | None, floor: int) -> None:
    history = [
        failed(30_000, "oom_killed", 1.0),
        failed(60_000, "oom_killed", 2.0),
        failed(25_000, "oom_killed"),
    ]
    p = project(history, declared_mb=None, scale=scale, margin=0.0)
    assert p == Projection(floor, "observed", 0)


def test_an_oom_kill_at_a_scale_within_float_noise_binds() -> None:
    history = [failed(30_000, "oom_killed", 0.1 + 0.2)]
    p = project(history, declared_mb=None, scale=0.3 - 1e-12, margin=0.0)
    assert p == Projection(30_000, "observed", 0)


def test_the_margin_applies_to_fit_and_floor_alike() -> None:
    history = [ok(10_000, 1.0), ok(20_000, 2.0)]
    assert project(history, declared_mb=None, scale=3.0, margin=0.5) == Projection(45_000, "fit", 2)
    floor = [failed(10_000, "oom_killed")]
    assert project(floor, declared_mb=2_000, scale=None, margin=0.5) == Projection(
        15_000, "declared", 0
    )


# --- the fit's remaining edges -------------------------------------------------------------


def test_a_flat_fit_takes_the_highest_peak_not_the_mean_plus_the_worst_residual() -> None:
    # Three runs at scale 1 (1000, 10000, 10000) and one at 2 (7000): slope exactly 0.
    # The highest peak is 10000; mean plus worst residual would be 7000 + 6000.
    history = [ok(1_000, 1.0), ok(10_000, 1.0), ok(10_000, 1.0), ok(7_000, 2.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(10_000, "fit", 4)


def test_a_gentle_slope_is_still_a_slope() -> None:
    # (1, 10000) and (3, 10001): half a MB per unit of scale, 10002 at scale 5.
    history = [ok(10_000, 1.0), ok(10_001, 3.0)]
    p = project(history, declared_mb=None, scale=5.0, margin=0.0)
    assert p == Projection(10_002, "fit", 2)


def test_float_noise_scales_share_one_recency_window() -> None:
    # 0.1 + 0.2 and 0.3 are one scale: its newest ten runs are the ten at 3000, so the old
    # 50000 at 0.1 + 0.2 is out of the window, and the line is y = 10000 x.
    history = [ok(50_000, 0.1 + 0.2)] + [ok(3_000, 0.3)] * 10 + [ok(20_000, 2.0)]
    p = project(history, declared_mb=None, scale=3.0, margin=0.0)
    assert p == Projection(30_000, "fit", 11)


def test_tiny_scales_within_the_absolute_tolerance_are_the_same_scale() -> None:
    p = project([ok(1_000, 1e-13)], declared_mb=None, scale=2e-13, margin=0.0)
    assert p == Projection(1_000, "observed", 1)


@pytest.mark.parametrize(
    ("margin", "mb"),
    [
        (0.0004, 1001),  # 1000.4 rounds up: never under the peak plus margin
        (3e-10, 1000),  # 1000.0000003 is float noise at six decimals: no extra MiB
        (0.05, 1050),
    ],
)
def test_the_margin_rounds_up_to_whole_mib_past_float_noise(margin: float, mb: int) -> None:
    p = project([ok(1_000)], declared_mb=None, scale=None, margin=margin)
    assert p == Projection(mb, "observed", 1)
