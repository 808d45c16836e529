"""Cards by name and queue edits through the real CLI: --cards / --not-cards place a job
on the cards it names (or keep it off them), `gpus` shows who waits for which card, and
`update` changes a queued job's priority, time limit or cards, refusing other jobs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .conftest import Daemon


def cli_json(d: Daemon, *args: str) -> Any:
    return json.loads(d.cli(*args, "--json").stdout)


def submit(d: Daemon, *args: str) -> int:
    return int(d.cli("submit", *args).stdout.strip())


def test_pinned_jobs_run_on_their_cards_or_wait_for_them(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="4x8G")
    show = 'echo "on $CUDA_VISIBLE_DEVICES"'
    two = submit(d, "--cards", "2", "--", "sh", "-c", show)
    three = submit(d, "--not-cards", "0-2", "--", "sh", "-c", show)
    for job_id, card in ((two, 2), (three, 3)):
        job = d.wait_done(job_id)
        assert (job["state"], job["gpus"], job["cards"]) == ("succeeded", [card], [card])
        assert d.cli("logs", str(job_id)).stdout == f"on {card}\n"

    blocker = submit(d, "--cards", "1", "--", "sleep", "300")
    d.wait_state(blocker, "running")
    waiter = submit(d, "--cards", "1", "--", "true")
    job = d.wait_for(lambda: (j := d.show(waiter))["waiting_for"] and j, what="the pinned job held")
    assert job["state"] == "queued"
    assert job["waiting_for"] == "waiting for its cards (card 1): needs 1 free GPU, 0 free"
    cards = {c["index"]: c for c in cli_json(d, "gpus")}
    assert cards[1]["pinned_jobs"] == [waiter] and cards[0]["pinned_jobs"] == []
    assert "PINNED" in d.cli("gpus").stdout
    listed = {j["id"]: j for j in cli_json(d, "list")}
    assert listed[waiter]["cards"] == [1]
    assert "1 asked, only on cards 1" in d.cli("show", str(waiter)).stdout
    d.cli("cancel", str(blocker))
    assert d.wait_done(waiter)["gpus"] == [1]


def test_impossible_pins_are_refused_at_submit(daemon: Daemon) -> None:
    d = daemon  # two cards
    for args, code, words in (
        (("--cards", "7"), 1, "--cards: no card 7; this machine has cards 0, 1"),
        (("--not-cards", "3"), 1, "--not-cards: no card 3"),
        (("--gpus", "2", "--not-cards", "1"), 1, "asks for 2 GPUs but may use only 1 (card 0)"),
        (("--gpus", "2", "--cards", "1"), 2, "--gpus 2, but --cards leaves only 1 card(s)"),
        (("--gpus", "0", "--cards", "1"), 2, "apply to GPU jobs"),
        (("--cards", "x"), 2, "--cards: 'x' is not a card index"),
    ):
        done = d.cli("submit", *args, "--", "true", check=False)
        assert (done.returncode, done.stdout) == (code, ""), done.stderr
        assert words in done.stderr
    assert d.call({"type": "list"})["jobs"] == []


def test_update_reorders_edits_and_refuses_what_is_not_queued(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G")
    running = submit(d, "--", "sleep", "300")
    d.wait_state(running, "running")
    write = f"echo $GPUSV_JOB_ID >> {d.root / 'order'}"
    a, b, c = (submit(d, "--", "sh", "-c", write) for _ in range(3))
    assert d.cli("update", str(c), "--priority", "5").stdout == f"{c} updated\n"
    assert d.cli("update", str(c), "--priority", "5").stdout == f"{c} unchanged\n"
    d.cli("update", str(b), "--time", "1h", "--cards", "0")
    job = d.show(b)
    assert (job["time_limit_s"], job["cards"]) == (3600.0, [0])
    updated = [e for e in job["events"] if e["kind"] == "updated"]
    assert [e["message"] for e in updated] == [
        f"time limit none -> 3600s; cards any -> 0 (by uid {os.getuid()})"
    ]
    d.cli("update", str(b), "--cards", "all")
    assert d.show(b)["cards"] is None

    mixed = d.cli("update", str(a), str(running), "--priority", "1", check=False)
    assert mixed.returncode == 1 and mixed.stdout == f"{a} updated\n"
    assert f"job {running}: is running; only a queued job can be updated" in mixed.stderr
    bad = d.cli("update", str(a), "--cards", "3", check=False)
    assert bad.returncode == 1 and "no card 3" in bad.stderr
    assert d.cli("update", str(a), check=False).returncode == 2

    d.cli("cancel", str(running))
    for job_id in (a, b, c):
        d.wait_done(job_id)
    # c (priority 5) first, then a (priority 1), then b.
    assert (d.root / "order").read_text().split() == [str(c), str(a), str(b)]
    ended = d.cli("update", str(c), "--priority", "0", check=False)
    assert ended.returncode == 1 and "is succeeded; only a queued job" in ended.stderr
