"""An attempt as the protocol shows it: every field under its own name, the internal
ones (the job id, the memory key and scale, the pid's start time) left out."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime

from supervisor.core.records import Attempt, iso_at


def test_an_ended_attempt_shows_every_field_under_its_name() -> None:
    attempt = Attempt(
        job_id=7,
        n=2,
        gpus=(1, 3),
        started_at="2026-01-02T03:04:05Z",
        mem_key="train",
        mem_scale=1.5,
        pid=4321,
        pid_start=99.5,
        ended_at="2026-01-02T04:00:00Z",
        exit_code=None,
        signal=9,
        reason="oom_killed",
        peak_rss_mb=2048,
        peak_vram_mb=7000,
        evidence={"source": "kernel"},
        gpu_uuids=("GPU-a", "GPU-b"),
    )
    assert attempt.to_json() == {
        "n": 2,
        "gpus": [1, 3],
        "gpu_uuids": ["GPU-a", "GPU-b"],
        "pid": 4321,
        "started_at": "2026-01-02T03:04:05Z",
        "ended_at": "2026-01-02T04:00:00Z",
        "exit_code": None,
        "signal": 9,
        "reason": "oom_killed",
        "peak_rss_mb": 2048,
        "peak_vram_mb": 7000,
        "evidence": {"source": "kernel"},
        "stopping": None,
    }


def test_a_fresh_attempt_shows_what_is_not_known_yet_as_null() -> None:
    attempt = Attempt(job_id=1, n=1, gpus=(), started_at="2026-01-02T03:04:05Z", mem_key="k")
    assert attempt.to_json() == {
        "n": 1,
        "gpus": [],
        "gpu_uuids": [],
        "pid": None,
        "started_at": "2026-01-02T03:04:05Z",
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "reason": None,
        "peak_rss_mb": None,
        "peak_vram_mb": None,
        "evidence": None,
        "stopping": None,
    }


def test_an_attempt_that_exited_shows_its_code() -> None:
    attempt = Attempt(1, 1, (0,), "s", "k", ended_at="e", exit_code=3, reason="exit_nonzero")
    shown = attempt.to_json()
    assert (shown["exit_code"], shown["signal"], shown["reason"]) == (3, None, "exit_nonzero")


def _datetime_stamp(wall: float) -> str:
    return (
        datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def test_a_stamp_is_the_one_datetime_gives_in_any_order_and_at_every_rounding_edge() -> None:
    # iso_at formats each second once: stamps out of order, and those a rounding carries
    # into the next second, must still be datetime's, to the character.
    rng = random.Random(7)
    walls = [rng.uniform(0, 4e9) for _ in range(3000)]
    for base in (0.0, 1.0, 1_764_633_600.0, 2_000_000_000.0):
        for frac in (0.0, 0.0004995, 0.0005, 0.000999, 0.9994999, 0.9995, 0.9999994, 0.9999996):
            walls += [base + frac, base - 1 + frac if base else frac]
    rng.shuffle(walls)
    assert [iso_at(w) for w in walls] == [_datetime_stamp(w) for w in walls]
    assert iso_at(1_764_633_600.9999996) == "2025-12-02T00:00:01.000Z"


def test_a_running_attempt_being_stopped_says_why_and_an_ended_one_does_not() -> None:
    stopping = Attempt(3, 1, (0,), "2026-01-01T00:00:00.000Z", "k", stop_reason="cancelled")
    assert stopping.to_json()["stopping"] == "cancelled"
    ended = replace(stopping, ended_at="2026-01-01T00:00:09.000Z", reason="cancelled")
    assert ended.to_json()["stopping"] is None
