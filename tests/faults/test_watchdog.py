"""The no-progress watchdog: pure decisions over fake monotonic times."""

from __future__ import annotations

import os
import time

import pytest

from supervisor.faults.cputime import cpu_seconds
from supervisor.faults.watchdog import ProgressState, ProgressTracker, check_progress, verdict

T0 = 1000.0
TIMEOUT = 1800.0


def idle_since(start: float, last_progress: float = T0) -> ProgressState:
    return ProgressState(last_progress_at=last_progress, low_util_since=start, max_util_seen=0.0)


# --- check_progress --------------------------------------------------------------------------


def test_hung_when_silent_and_idle_for_the_whole_timeout() -> None:
    state = idle_since(T0)
    assert check_progress(state, now=T0 + TIMEOUT, timeout_s=TIMEOUT) == "hung"
    assert check_progress(state, now=T0 + TIMEOUT - 1, timeout_s=TIMEOUT) == "ok"


def test_silent_but_busy_is_ok() -> None:
    busy = ProgressState(last_progress_at=T0, low_util_since=None, max_util_seen=97.0)
    assert check_progress(busy, now=T0 + 10 * TIMEOUT, timeout_s=TIMEOUT) == "ok"


def test_idle_only_recently_is_ok_until_idle_for_the_timeout() -> None:
    state = idle_since(T0 + 3000.0)  # busy for a long time after its last output, then idle
    assert check_progress(state, now=T0 + 4000.0, timeout_s=TIMEOUT) == "ok"
    assert check_progress(state, now=T0 + 3000.0 + TIMEOUT, timeout_s=TIMEOUT) == "hung"


def test_idle_but_printing_is_ok() -> None:
    state = idle_since(T0, last_progress=T0 + 5000.0)
    assert check_progress(state, now=T0 + 5000.0 + TIMEOUT - 1, timeout_s=TIMEOUT) == "ok"


@pytest.mark.parametrize("timeout", [None, 0.0, -5.0])
def test_no_timeout_disables_the_watchdog(timeout: float | None) -> None:
    assert check_progress(idle_since(T0), now=T0 + 1e9, timeout_s=timeout) == "ok"


@pytest.mark.parametrize(
    ("now", "low_since", "verdict"),
    [
        # last progress at 1000, timeout 100
        (1099.0, 500.0, "ok"),  # silent 99 s: not yet
        (1100.0, 500.0, "hung"),  # silent 100 s, idle since before the last progress
        (1100.0, 1000.0, "hung"),  # idle from the very moment of the last progress
        (1100.0, None, "ok"),  # silent but busy
        (1100.0, 1001.0, "ok"),  # busy for a second after it, then idle: idle only 99 s
        (1200.0, 1100.0, "hung"),  # idle exactly the timeout
        (1200.0, 1100.5, "ok"),
        (5000.0, 4900.0, "hung"),
        (5000.0, 4901.0, "ok"),
    ],
)
def test_hung_only_when_silent_and_idle_for_the_whole_timeout(
    now: float, low_since: float | None, verdict: str
) -> None:
    state = ProgressState(last_progress_at=1000.0, low_util_since=low_since, max_util_seen=0.0)
    assert check_progress(state, now=now, timeout_s=100.0) == verdict


# --- ProgressTracker -------------------------------------------------------------------------


def test_output_growth_is_progress_without_a_regex() -> None:
    tracker = ProgressTracker(None, started_at=T0)
    assert tracker.state().last_progress_at == T0
    tracker.on_size(0, T0 + 5)
    assert tracker.state().last_progress_at == T0
    tracker.on_size(120, T0 + 10)
    assert tracker.state().last_progress_at == T0 + 10
    tracker.on_size(120, T0 + 20)
    assert tracker.state().last_progress_at == T0 + 10
    tracker.on_output("step 3\n", T0 + 30)
    assert tracker.state().last_progress_at == T0 + 30
    assert tracker.last_match is None


def test_with_a_regex_only_matches_are_progress() -> None:
    tracker = ProgressTracker(r"Fra:\d+", started_at=T0)
    tracker.on_size(5000, T0 + 10)
    tracker.on_output("Loading scene\nstill loading\n", T0 + 20)
    assert tracker.state().last_progress_at == T0
    assert tracker.last_match is None
    tracker.on_output("Fra:941 Mem:1.2G | Rendering\nFra:942 Mem:1.2G\n", T0 + 30)
    assert tracker.state().last_progress_at == T0 + 30
    assert tracker.last_match == "Fra:942"


def test_regex_group_one_is_the_shown_match() -> None:
    tracker = ProgressTracker(r"step (\d+)/\d+", started_at=T0)
    tracker.on_output("step 7/100 loss=0.3\n", T0 + 1)
    assert tracker.last_match == "7"


def test_matches_span_chunks_and_carriage_returns() -> None:
    tracker = ProgressTracker(r"\d+%", started_at=T0)
    tracker.on_output("progress: 4", T0 + 1)
    assert tracker.state().last_progress_at == T0  # the line is not complete yet
    tracker.on_output("2%|####  \r progress: 43%|#### ", T0 + 2)
    assert (tracker.state().last_progress_at, tracker.last_match) == (T0 + 2, "42%")
    tracker.on_output("\r", T0 + 3)
    assert (tracker.state().last_progress_at, tracker.last_match) == (T0 + 3, "43%")


def test_a_huge_unterminated_line_is_still_searched() -> None:
    tracker = ProgressTracker(r"done \d+", started_at=T0)
    tracker.on_output("x" * 70_000 + " done 5", T0 + 1)
    assert tracker.last_match == "done 5"


def test_utilization_tracks_when_the_cards_went_idle() -> None:
    tracker = ProgressTracker(None, started_at=T0)
    tracker.on_utilization(88.0, T0 + 1)
    assert tracker.state().low_util_since is None
    tracker.on_utilization(0.0, T0 + 2)
    tracker.on_utilization(1.0, T0 + 3)
    assert tracker.state().low_util_since == T0 + 2
    tracker.on_utilization(35.0, T0 + 4)
    assert tracker.state().low_util_since is None
    assert tracker.state().max_util_seen == 88.0
    tracker.on_output("x", T0 + 5)  # progress opens a new window
    assert tracker.state().max_util_seen == 0.0


def test_tracker_and_check_together() -> None:
    tracker = ProgressTracker(r"iter \d+", started_at=T0)
    tracker.on_output("iter 1\n", T0 + 10)
    for t in range(20, 4000, 30):
        tracker.on_utilization(0.0, T0 + t)
        tracker.on_output("waiting for data...\n", T0 + t)
    state = tracker.state()
    # Silent since T0 + 10, but known idle only from the first sample at T0 + 20.
    assert check_progress(state, now=T0 + 20 + TIMEOUT - 1, timeout_s=TIMEOUT) == "ok"
    assert check_progress(state, now=T0 + 20 + TIMEOUT, timeout_s=TIMEOUT) == "hung"


def test_a_catastrophic_pattern_is_dropped_instead_of_stalling() -> None:
    import time

    from supervisor.faults.watchdog import ProgressTracker

    tracker = ProgressTracker(r"(a|aa)+$", started_at=0.0)
    began = time.monotonic()
    tracker.on_output("a" * 64 + "!\n", now=5.0)
    assert time.monotonic() - began < 5.0  # `re` would take longer than the universe
    assert tracker.regex_gave_up
    assert tracker.state().last_progress_at == 5.0
    tracker.on_output("more\n", now=9.0)  # output growth counts from now on
    assert tracker.state().last_progress_at == 9.0


# --- unknown utilization, the CPU, and the pure no-progress rule -----------------------------


def test_unknown_utilization_never_makes_a_job_idle() -> None:
    tracker = ProgressTracker(None, T0)
    for t in range(0, 10 * int(TIMEOUT), 10):
        tracker.on_utilization(None, T0 + t)
    state = tracker.state()
    assert state.low_util_since is None and state.util_unknown
    assert verdict(state, now=T0 + 10 * TIMEOUT, timeout_s=TIMEOUT) == "ok"


def test_unknown_utilization_is_told_once() -> None:
    tracker = ProgressTracker(None, T0)
    tracker.on_utilization(3.0, T0)
    assert not tracker.first_unknown()
    tracker.on_utilization(None, T0 + 1)
    assert tracker.first_unknown()
    tracker.on_utilization(None, T0 + 2)
    assert not tracker.first_unknown()


def test_a_job_busy_on_the_cpu_is_not_idle_at_zero_percent_gpu() -> None:
    tracker = ProgressTracker(None, T0)
    cpu = 0.0
    for t in range(0, 10 * int(TIMEOUT), 10):
        cpu += 18.1  # 181 % of a core over each 10 s: a CPU render printing nothing
        tracker.on_utilization(0.0, T0 + t, cpu_s=cpu)
    state = tracker.state()
    assert state.low_util_since is None and state.max_cpu_pct == 181.0
    assert verdict(state, now=T0 + 10 * TIMEOUT, timeout_s=TIMEOUT) == "ok"


def test_a_sleeping_job_at_zero_percent_is_idle() -> None:
    tracker = ProgressTracker(None, T0)
    for t in range(0, int(TIMEOUT) + 20, 10):
        tracker.on_utilization(0.0, T0 + t, cpu_s=0.25)  # no CPU used between samples
    assert verdict(tracker.state(), now=T0 + TIMEOUT + 10, timeout_s=TIMEOUT) == "idle"


def test_the_stall_rule_fires_at_full_utilization() -> None:
    tracker = ProgressTracker(None, T0)
    for t in range(0, 200, 10):
        tracker.on_utilization(100.0, T0 + t)
    state = tracker.state()
    assert verdict(state, now=T0 + 119, timeout_s=TIMEOUT, stall_timeout_s=120) == "ok"
    assert verdict(state, now=T0 + 120, timeout_s=TIMEOUT, stall_timeout_s=120) == "stalled"
    assert verdict(state, now=T0 + 10 * TIMEOUT, timeout_s=TIMEOUT, stall_timeout_s=None) == "ok"
    tracker.on_output("step 5\n", T0 + 200)
    assert verdict(tracker.state(), now=T0 + 300, timeout_s=TIMEOUT, stall_timeout_s=120) == "ok"


def test_cpu_seconds_of_this_process_grow_and_gone_pids_count_nothing() -> None:
    pid = os.getpid()
    before = cpu_seconds([pid, 2**22 + 1])
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert cpu_seconds([pid]) > before
