"""Reservations for wide jobs through the CLI, on simulated cards: a two-card job
submitted before one-card jobs keeps the card that frees; a job whose --time ends before
it is due backfills there, jobs without a limit wait behind it; and the same among the
own cards of jobs pinned with --cards."""

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


def test_a_pinned_wide_job_keeps_only_its_own_cards_and_pinned_jobs_backfill_there(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("3x8G")
    busy = submit(d, "--cards", "1", "--time", "1h", "--", "sleep", "300")
    d.wait_state(busy, "running")
    wide = submit(d, "--gpus", "2", "--cards", "0,1", "--", "sleep", "300")
    kept = f"card 0 reserved for it, the rest due by job {busy}'s time limit"
    d.wait_for(lambda: kept in d.show(wide)["waiting_for"], what="card 0 kept")
    # A pinned job whose --time ends before the wide one is due takes the kept card.
    short = submit(d, "--cards", "0", "--time", "10m", "--", "true")
    assert d.wait_done(short)["state"] == "succeeded"
    assert d.show(short)["gpus"] == [0]
    # Without --time it waits for it; an unpinned job goes to card 2, which is not kept.
    pinned = submit(d, "--cards", "0", "--", "sleep", "300")
    other = submit(d, "--", "sleep", "300")
    assert d.wait_state(other, "running")["gpus"] == [2]
    blocked = f"waiting for card 0, reserved for job {wide}"
    d.wait_for(lambda: blocked in (d.show(pinned)["waiting_for"] or ""), what="a hold")
    assert d.show(pinned)["state"] == "queued"
    d.cli("cancel", str(busy))
    assert sorted(d.wait_state(wide, "running")["gpus"]) == [0, 1]
    d.cli("cancel", str(wide), str(pinned), str(other))
