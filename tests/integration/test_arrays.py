"""Job arrays: one job per index with its index in the environment, a cap on how many run
at once (checked on the daemon's own attempt records), resubmission of the failed indices,
and cancel and wait over the whole array."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from .conftest import Daemon

CONFIG = "cpu_slots = 16\nmax_queued_per_user = 40\n"
# Indices 3, 8, 13 and 18 fail until the file `fixed` exists.
JOB = (
    'echo "$GPUSV_ARRAY_INDEX" > "seen-$GPUSV_ARRAY_ID-$GPUSV_ARRAY_INDEX"; sleep 0.3; '
    "[ $((GPUSV_ARRAY_INDEX % 5)) -ne 3 ] || [ -e fixed ]"
)


def submit_array(d: Daemon, spec: str, *argv: str) -> list[int]:
    out = d.cli("submit", "--gpus", "0", "--retries", "0", "--array", spec, "--", *argv).stdout
    return [int(x) for x in out.split()]


def most_at_once(d: Daemon, ids: list[int]) -> int:
    """The most attempts whose [started, ended] intervals overlap, from the daemon's records."""
    edges = []
    for i in ids:
        for at in d.show(i)["attempts"]:
            edges.append((datetime.fromisoformat(at["started_at"]), 1))
            edges.append((datetime.fromisoformat(at["ended_at"]), -1))
    running = most = 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start
        running += delta
        most = max(most, running)
    return most


def test_an_array_of_twenty_runs_four_at_a_time_and_reruns_its_failures(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon("2x24G", config=CONFIG)
    ids = submit_array(d, "0-19%4", "sh", "-c", JOB)
    assert len(ids) == 20
    array = ids[0]
    waited = d.cli("wait", "--array", str(array), check=False, timeout=120)
    assert waited.returncode != 0  # some indices failed
    jobs = [d.show(i) for i in ids]
    assert [j["array_index"] for j in jobs] == list(range(20))
    assert {j["array_id"] for j in jobs} == {array}
    assert 1 <= most_at_once(d, ids) <= 4
    for i in range(20):
        assert (d.root / f"seen-{array}-{i}").read_text().strip() == str(i)
    failed = sorted(j["array_index"] for j in jobs if j["state"] == "failed")
    assert failed == [3, 8, 13, 18]
    listing = d.cli("list").stdout
    assert f"array {array}: 20 indices: 16 succeeded, 4 failed" in listing

    (d.root / "fixed").touch()
    again = [int(x) for x in d.cli("restart", "--array", str(array), "--failed").stdout.split()]
    assert sorted(d.show(i)["array_index"] for i in again) == failed
    assert all(d.show(i)["array_id"] == array for i in again)
    assert d.cli("wait", "--array", str(array), timeout=120).returncode == 0
    assert f"array {array}: 20 indices: 20 succeeded" in d.cli("list").stdout
    rows = d.cli("list", "--array", str(array), "--json").stdout
    assert rows.count('"array_id"') == 24
    assert d.cli("restart", "--array", str(array), "--failed").stdout == ""


def test_cancel_array_ends_all_of_it(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("2x24G", config=CONFIG)
    ids = submit_array(d, "1,3,5-9%2", "sleep", "300")
    assert len(ids) == 7
    d.wait_for(lambda: sum(d.show(i)["state"] == "running" for i in ids) == 2, what="two running")
    held = [d.show(i) for i in ids if d.show(i)["state"] == "queued"]
    assert held and all(
        "at most 2 of its jobs run at once" in (j["waiting_for"] or "") for j in held
    )
    d.cli("cancel", "--array", str(ids[0]))
    for i in ids:
        d.wait_state(i, "cancelled")


def test_batch_with_max_running(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("2x24G", config=CONFIG)
    lines = "".join("sleep 0.3\n" for _ in range(6))
    out = d.cli("submit", "--gpus", "0", "--max-running", "2", "--batch", "-", input=lines)
    ids = [int(x) for x in out.stdout.split()]
    for i in ids:
        d.wait_done(i)
    assert 1 <= most_at_once(d, ids) <= 2


def test_bad_arrays_are_refused_and_change_nothing(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("2x24G", config=CONFIG)
    for spec, words in [
        ("5-3", "is empty"),
        ("x", "is not an index"),
        ("", "is not an index"),
        ("0-3%0", "at least 1"),
        ("1,1", "appears twice"),
    ]:
        r = d.cli("submit", "--array", spec, "--", "true", check=False)
        assert r.returncode == 2, (spec, r.stderr)
        assert words in r.stderr, (spec, r.stderr)
    too_many = d.cli("submit", "--array", "0-40", "--", "true", check=False)
    assert too_many.returncode == 1
    assert "the limit is 40" in too_many.stderr
    assert d.call({"type": "list"})["jobs"] == []
