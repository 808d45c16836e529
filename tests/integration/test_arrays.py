"""Job arrays: one job per index with its index in the environment, a cap on how many run
at once (checked on the daemon's own attempt records), resubmission of the failed indices,
cancel and wait over the whole array, and jobs that wait for a whole array (--after,
--after-any) across a daemon restart."""

from __future__ import annotations

import json
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
    """The array's job ids, from `submit --json`'s array object."""
    args = ("submit", "--gpus", "0", "--retries", "0", "--array", spec, "--json", "--", *argv)
    array = json.loads(d.cli(*args).stdout)
    assert array["id"] == array["ids"][0] and len(array["indices"]) == len(array["ids"])
    return [int(x) for x in array["ids"]]


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


# An index waits for its own file `go-INDEX`, then writes `out-INDEX`; index 1 fails.
GATED = (
    'until [ -e "go-$GPUSV_ARRAY_INDEX" ]; do sleep 0.05; done; '
    'echo "$GPUSV_ARRAY_INDEX" > "out-$GPUSV_ARRAY_INDEX"; [ "$GPUSV_ARRAY_INDEX" != 1 ]'
)


def test_submit_prints_the_arrays_id_once_for_scripts(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("2x24G", config=CONFIG)
    d.cli("pause")
    out = d.cli("submit", "--gpus", "0", "--array", "0-3", "--", "true").stdout
    array = int(out)  # one line, one id
    listed = json.loads(d.cli("list", "--array", str(array), "--json").stdout)
    assert [j["array"] for j in sorted(listed, key=lambda j: j["id"])] == [
        {"id": array, "index": i} for i in range(4)
    ]
    d.cli("cancel", "--array", str(array))
    assert {d.show(j["id"])["state"] for j in listed} == {"cancelled"}


def test_a_merge_after_an_array_waits_for_every_index(make_daemon: Callable[..., Daemon]) -> None:
    """Named by a later index's id, the merge still waits for all of them; a failed
    index fails an --after child, and an --after-any child runs all the same."""
    d = make_daemon("2x24G", config=CONFIG)
    ids = submit_array(d, "0-2", "sh", "-c", GATED)
    merge = int(d.cli("submit", "--gpus", "0", "--after", str(ids[2]), "--", "true").stdout)
    tidy = int(d.cli("submit", "--gpus", "0", "--after-any", str(ids[0]), "--", "true").stdout)
    assert d.show(merge)["after"] == ids and d.show(tidy)["after_any"] == ids
    (d.root / "go-0").touch()
    (d.root / "go-2").touch()
    d.wait_state(ids[0], "succeeded")
    d.wait_state(ids[2], "succeeded")
    for child in (merge, tidy):
        job = d.show(child)
        assert (job["state"], job["waiting_for"]) == ("queued", f"waiting for job {ids[1]}")

    d.stop()  # what they wait for is stored: a new daemon waits for the same
    d.start()
    assert d.show(merge)["waiting_for"] == f"waiting for job {ids[1]}"
    (d.root / "go-1").touch()
    assert d.wait_done(ids[1])["state"] == "failed"
    assert d.wait_done(merge)["reason"] == "dependency_failed"
    assert d.wait_done(tidy)["state"] == "succeeded"
    late = d.cli("submit", "--gpus", "0", "--after", str(ids[0]), "--", "true").stdout
    assert d.wait_done(int(late))["reason"] == "dependency_failed"  # the array has a failure
    gone = d.cli("submit", "--after-any", "999", "--", "true", check=False)
    assert gone.returncode == 1 and "--after-any: no job 999" in gone.stderr


def test_cancel_takes_ranges_and_lists(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon("2x24G", config=CONFIG)
    d.cli("pause")
    ids = [
        int(x)
        for x in d.cli("submit", "--gpus", "0", "--batch", "-", input="true\n" * 6).stdout.split()
    ]
    for bad, words in [
        ("3-", "not a job id"),
        ("x", "not a job id"),
        ("4-2", "is empty"),
        ("0", "not a job id"),
    ]:
        r = d.cli("cancel", f"{ids[0]},{bad}", check=False)
        assert r.returncode == 2 and words in r.stderr, (bad, r.stderr)
    assert {d.show(i)["state"] for i in ids} == {"queued"}  # a bad one changes nothing
    d.cli("cancel", f"{ids[0]}-{ids[2]}")
    d.cli("cancel", f"{ids[3]},{ids[4]}")
    assert [d.show(i)["state"] for i in ids] == ["cancelled"] * 5 + ["queued"]
