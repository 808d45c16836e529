"""Shared cards on two simulated 24 GiB cards: jobs pack by declared VRAM against what is
free (live use included), whole-card jobs never share, and observed peaks feed later runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from .conftest import Daemon

GIB_MB = 1024


def submit_shared(d: Daemon, *argv: str, vram: str | None = "7G", key: str = "") -> int:
    flags = ["--share"] + (["--vram", vram] if vram else []) + (["--mem-key", key] if key else [])
    return int(d.cli("submit", *flags, "--", *argv).stdout.split()[0])


def cards_of(d: Daemon, ids: list[int]) -> Counter[int]:
    return Counter(g for i in ids for g in d.show(i)["gpus"])


def test_six_shared_jobs_run_three_per_card_and_a_whole_card_job_waits(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("2x24G")
    ids = [submit_shared(d, "sleep", "300") for _ in range(6)]
    for i in ids:
        d.wait_state(i, "running")
    assert cards_of(d, ids) == Counter({0: 3, 1: 3})
    whole = d.submit("sleep", "300")
    held = d.wait_for(lambda: (j := d.show(whole))["waiting_for"] and j, what="a hold")
    assert held["state"] == "queued"
    assert held["waiting_for"] == "waiting for 1 free GPU, 0 free (cards 0, 1 run shared jobs)"
    seventh = submit_shared(d, "sleep", "300")
    held = d.wait_for(lambda: (j := d.show(seventh))["waiting_for"] and j, what="a hold")
    assert held["waiting_for"].startswith("waiting for VRAM: needs ~7 GiB, at most ~3 GiB free")
    # Card 0's shared jobs leave (the seventh first, or it would take their room as
    # they go, packing as it should): the whole-card job takes card 0, alone.
    d.cli("cancel", str(seventh))
    on_zero = [i for i in ids if d.show(i)["gpus"] == [0]]
    d.cli("cancel", *map(str, on_zero))
    assert d.wait_state(whole, "running")["gpus"] == [0]
    d.cli("cancel", *(str(i) for i in [*ids, whole] if i not in on_zero))


def test_a_card_used_by_something_else_takes_no_shared_job(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("2x24G", start=False)
    d.set_card(0, vram_used_mb=20 * GIB_MB)
    d.start()
    ids = [submit_shared(d, "sleep", "300") for _ in range(4)]
    for i in ids[:3]:
        d.wait_state(i, "running")
    fourth = d.wait_for(lambda: (j := d.show(ids[3]))["waiting_for"] and j, what="a hold")
    assert fourth["waiting_for"].startswith("waiting for VRAM: needs ~7 GiB, at most ~4 GiB free")
    assert cards_of(d, ids[:3]) == Counter({1: 3})
    d.cli("cancel", *map(str, ids))


def test_a_whole_card_job_never_shares(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("2x24G")
    whole = d.submit("sleep", "300")
    assert d.wait_state(whole, "running")["gpus"] == [0]
    ids = [submit_shared(d, "sleep", "300", vram="1G") for _ in range(3)]
    for i in ids:
        assert d.wait_state(i, "running")["gpus"] == [1]
    other = d.submit("sleep", "300")
    held = d.wait_for(lambda: (j := d.show(other))["waiting_for"] and j, what="a hold")
    assert "card 1 run shared jobs" in held["waiting_for"]
    d.cli("cancel", *map(str, [whole, *ids, other]))


def test_peak_vram_is_recorded_and_lets_the_key_run_without_vram(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("2x24G")
    no_history = d.cli("submit", "--share", "--mem-key", "evalx", "--", "true", check=False)
    assert no_history.returncode == 1
    assert "--share needs --vram" in no_history.stderr
    too_big = d.cli("submit", "--share", "--vram", "30G", "--", "true", check=False)
    assert too_big.returncode == 1
    assert "the largest card has" in too_big.stderr
    assert d.call({"type": "list"})["jobs"] == []  # bad input changed nothing

    loop = "while [ ! -e go ]; do sleep 0.05; done"
    first = submit_shared(d, "sh", "-c", loop, key="evalx")
    pid = d.wait_pid(first)
    card = d.show(first)["gpus"][0]
    d.set_card(card, processes={str(pid): 5000})
    d.wait_for(
        lambda: d.show(first)["attempts"][-1]["peak_vram_mb"] == 5000, what="the VRAM sample"
    )
    d.set_card(card, processes={})
    (d.root / "go").touch()
    done = d.wait_done(first)
    assert done["state"] == "succeeded"
    assert done["attempts"][-1]["peak_vram_mb"] == 5000

    second = submit_shared(d, "true", vram=None, key="evalx")
    assert d.show(second)["vram_mb"] is None
    assert d.wait_done(second)["state"] == "succeeded"
