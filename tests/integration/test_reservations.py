"""Reservations for wide jobs through the CLI, on two simulated cards: a two-card job
submitted before one-card jobs keeps the card that frees; a job whose --time ends before
it is due backfills there, jobs without a limit wait behind it."""

from __future__ import annotations

from collections.abc import Callable

from .conftest import Daemon


def submit(d: Daemon, *args: str) -> int:
    return int(d.cli("submit", *args).stdout.split()[0])


def test_a_two_card_job_keeps_the_card_that_frees_and_a_short_job_backfills(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("2x8G")
    first = submit(d, "--time", "1h", "--", "sleep", "300")
    second = submit(d, "--time", "2h", "--", "sleep", "300")
    for job in (first, second):
        d.wait_state(job, "running")
    wide = submit(d, "--gpus", "2", "--", "sleep", "300")
    singles = [submit(d, "--", "sleep", "300") for _ in range(3)]
    held = d.wait_for(lambda: (j := d.show(wide))["waiting_for"] and j, what="a hold")
    assert "cards reserved for it as they free" in held["waiting_for"]
    d.cli("cancel", str(first))
    freed = d.show(first)["gpus"][0]
    kept = f"card {freed} reserved for it, the rest due by job {second}'s time limit"
    d.wait_for(lambda: kept in d.show(wide)["waiting_for"], what="the card kept")
    # A job that ends before the wide one is due takes the kept card and leaves it.
    short = submit(d, "--time", "10m", "--", "true")
    assert d.wait_done(short)["state"] == "succeeded"
    assert d.show(short)["gpus"] == [freed]
    blocked = f"waiting for card {freed}, reserved for job {wide}"
    for job in singles:
        shown = d.cli("show", str(job)).stdout
        assert blocked in shown and "--time ends before its start" in shown, shown
    d.cli("cancel", str(second))
    assert sorted(d.wait_state(wide, "running")["gpus"]) == [0, 1]
    assert all(d.show(job)["state"] == "queued" for job in singles)
    d.cli("cancel", str(wide), *map(str, singles))
