"""The heap handed back: when the daemon falls idle after it grew, and not otherwise."""

from __future__ import annotations

from supervisor.daemon.life.heap import IdleTrim, return_free_memory, rss_bytes


def test_an_idle_daemon_that_grew_is_trimmed_once() -> None:
    rss = [100]
    trims: list[int] = []

    def trim() -> None:
        trims.append(rss[0])
        rss[0] = 105  # what the trim gave back

    idle = IdleTrim(trim, lambda: rss[0], slack=10)
    rss[0] = 180
    assert not idle.seen(jobs=3)  # busy: never trimmed while jobs are there
    assert idle.seen(jobs=0) and trims == [180]
    assert not idle.seen(jobs=0)  # once: it has not grown since
    rss[0] = 114
    assert not idle.seen(jobs=0)  # within the slack of the last trim
    rss[0] = 116
    assert idle.seen(jobs=0) and trims == [180, 116]


def test_the_floor_is_the_least_seen_idle() -> None:
    rss = [100]
    trims: list[int] = []
    idle = IdleTrim(lambda: trims.append(rss[0]), lambda: rss[0], slack=10)
    rss[0] = 60  # trimmed at start, after it was made
    assert not idle.seen(jobs=0)
    rss[0] = 75
    assert idle.seen(jobs=0) and trims == [75]


def test_the_real_trim_and_rss_run_here() -> None:
    return_free_memory()  # glibc or not: never raises
    assert rss_bytes() > 0
