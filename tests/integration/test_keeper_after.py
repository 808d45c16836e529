"""A spawn that waits for its predecessor (`after`): real keeper, real sockets, no daemon.

A predecessor is held on a FIFO until the test releases it, so nothing here waits for a
time to pass: every wait is for a message, a file or a log line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper.client import Connection, KeeperError
from supervisor.keeper.journal import unframe

from .keeper_fixture import Keeper, alive, keeper, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups and other users need root"),
]

Message = dict[str, Any]
AFTER_1 = {"job": 1, "attempt": 1}
DROPPED = {"code": "dropped", "message": "dropped before it started"}


def _held(k: Keeper, name: str) -> tuple[list[str], Callable[[], object]]:
    """A command that runs until released, and what releases it."""
    fifo = k.home / name
    os.mkfifo(fifo)
    return ["sh", "-c", f"read x < {fifo}"], lambda: fifo.write_text("go\n")


def _busy_cgroup(k: Keeper, job: int) -> None:
    """The cgroup of the job's attempt 1 made already, a process in it (as a keeper that
    died mid-start leaves it): its spawn is refused at its turn with nothing recorded."""
    if k.v2 is None:
        pytest.skip("needs cgroup2 for a start refused at its turn")
    group = k.v2 / f"job-{job}-1"
    group.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    (group / "cgroup.procs").write_text(str(sleeper.pid))
    _sleepers.append(sleeper)


_sleepers: list[subprocess.Popen[bytes]] = []


def _jobs(conn: Connection) -> list[int]:
    """The records held. `list` is answered after every request sent before it on the
    same connection was handled, so a spawn that started would be among them."""
    return sorted(j["job"] for j in conn.call("list")["jobs"])


def _exit_event(conn: Connection) -> Message:
    while True:
        message = conn.event()
        if message.get("event") == "exit":
            return message["job"]  # type: ignore[no-any-return]


def _answers(conn: Connection, *rids: int) -> tuple[dict[int, Message], list[Message]]:
    """The answers to `rids`, whatever their order, and every message read meanwhile in
    the order it came (events are kept in conn.events as well)."""
    answers: dict[int, Message] = {}
    seen: list[Message] = []
    while len(answers) < len(rids):
        message = conn.receive()
        seen.append(message)
        if "event" in message:
            conn.events.append(message)
        elif message.get("id") in rids:
            answers[message["id"]] = message
    return answers, seen


def _starts(k: Keeper) -> list[int]:
    raw = (k.home / "journal").read_bytes().splitlines()
    lines = [unframe(line) for line in raw]
    return [line["job"] for line in lines if line["e"] == "start"]


def _one_held_one_parked(
    k: Keeper, conn: Connection, parker: Connection | None = None
) -> tuple[Message, Callable[[], object], Path, int]:
    """Job 1 running until released; job 2 (it touches its marker) sent to start after
    it, by `parker` if given. Job 1's record, the release, the marker and job 2's spawn
    request id."""
    argv, release = _held(k, "a")
    a = conn.call("spawn", **k.job(1, argv))["job"]
    marker = k.home / "b-ran"
    rid = (parker or conn).send("spawn", **k.job(2, ["touch", str(marker)], after=AFTER_1))
    return a, release, marker, rid


def test_a_spawn_after_a_running_attempt_starts_once_it_has_ended() -> None:
    with keeper() as k:
        conn = k.connect()
        a, release, marker, rid = _one_held_one_parked(k, conn)
        assert _jobs(conn) == [1]  # parked: no fork, no record, no answer
        release()
        answer = conn.reply(rid)
        assert answer["ok"], answer
        # Started once the predecessor's exit was written, before it was synced: its
        # answer comes first, the exit event (sent once synced) after it.
        assert not conn.events
        ended = _exit_event(conn)
        assert ended["job"] == 1
        b = answer["job"]
        assert b["started_at"] >= ended["ended_at"]
        assert b["pid"] != a["pid"]
        done = _exit_event(conn)
        assert (done["job"], done["exit_code"]) == (2, 0)
        assert marker.exists()
        assert _starts(k) == [1, 2]


def test_a_spawn_after_an_attempt_never_held_starts_at_once() -> None:
    """The key is the attempt: another attempt of a running job does not hold it back,
    while the running attempt itself does."""
    with keeper() as k:
        conn = k.connect()
        argv, release = _held(k, "a")
        conn.call("spawn", **k.job(1, argv))
        conn.call("spawn", **k.job(2, ["true"], after={"job": 1, "attempt": 2}))
        conn.call("spawn", **k.job(3, ["true"], after={"job": 9, "attempt": 1}))
        rid = conn.send("spawn", **k.job(4, ["true"], after=AFTER_1))
        assert _jobs(conn) == [1, 2, 3]
        release()
        assert conn.reply(rid)["ok"]


def test_a_spawn_after_an_ended_attempt_starts_at_once_acknowledged_or_not() -> None:
    with keeper() as k:
        conn = k.connect()
        conn.call("spawn", **k.job(1, ["true"]))
        assert _exit_event(conn)["job"] == 1  # ended, not acknowledged: still a record
        argv, release = _held(k, "y")
        conn.call("spawn", **k.job(5, argv))
        rid = conn.send("spawn", **k.job(6, ["true"], after={"job": 5, "attempt": 1}))
        conn.call("spawn", **k.job(2, ["true"], after=AFTER_1))  # answered while 5 runs
        conn.call("ack", job=1, attempt=1)
        conn.call("spawn", **k.job(3, ["true"], after=AFTER_1))  # no record of 1 now
        assert _jobs(conn) == [2, 3, 5]  # 6 waits for 5, and for nothing else
        release()
        assert conn.reply(rid)["ok"]


def test_a_killed_parked_spawn_is_dropped_and_never_runs() -> None:
    with keeper() as k:
        conn = k.connect()
        a, release, marker, spawn_rid = _one_held_one_parked(k, conn)
        kill_rid = conn.send("kill", job=2, attempt=1, grace_s=5)
        answers, seen = _answers(conn, spawn_rid, kill_rid)
        assert answers[spawn_rid] == {"id": spawn_rid, "ok": False, "error": DROPPED}
        assert answers[kill_rid] == {"id": kill_rid, "ok": True}
        assert [m["id"] for m in seen] == [spawn_rid, kill_rid]
        assert alive(a["pid"])
        with pytest.raises(KeeperError, match="unknown"):  # gone: as any key not held
            conn.call("kill", job=2, attempt=1, grace_s=5)
        release()
        assert _exit_event(conn)["exit_code"] == 0
        assert _jobs(conn) == [1]  # it would have started in the turn of that exit
        assert not marker.exists()
        conn.call("spawn", **k.job(2, ["touch", str(marker)]))  # the attempt is free
        assert _exit_event(conn)["exit_code"] == 0
        assert marker.exists()


def _never_ran_after_release(
    conn: Connection, k: Keeper, release: Callable[[], object], marker: Path
) -> None:
    """Once job 1 (what job 2 waited for) has exited: job 2 never started, neither in
    the keeper's records nor its journal, nor did its command run."""
    release()
    assert _exit_event(conn)["job"] == 1
    assert _jobs(conn) == [1]
    assert '"job":2' not in (k.home / "journal").read_text()
    assert not marker.exists()


def test_a_parked_spawn_goes_with_the_connection_that_sent_it() -> None:
    with keeper() as k:
        conn = k.connect()
        other = k.connect(attach=False)
        _, release, marker, _ = _one_held_one_parked(k, conn, other)
        other.call("ping")  # the spawn before it was read and parked
        assert _jobs(conn) == [1]
        other.close()
        log = k.home / "log"
        wait_for(
            lambda: "job 2 attempt 1: its connection closed before it started" in log.read_text(),
            "the parked spawn to be dropped",
        )
        _never_ran_after_release(conn, k, release, marker)
        assert conn.call("ping")["pid"] == k.pid
        conn.call("spawn", **k.job(2, ["touch", str(marker)]))  # not `exists`
        assert _exit_event(conn)["exit_code"] == 0
        assert marker.exists()


def test_a_newer_attach_drops_the_older_connections_parked_spawns_unanswered() -> None:
    """What recovery relies on: once attached, an attempt without a record never runs."""
    with keeper() as k:
        first = k.connect()
        _, release, marker, rid = _one_held_one_parked(k, first)
        first.call("ping")
        second = k.connect(attach=False)
        assert [j["job"] for j in second.call("attach")["jobs"]] == [1]
        seen: list[Message] = []
        with pytest.raises((ConnectionError, OSError)):
            while True:
                seen.append(first.receive())
        assert all(m.get("id") != rid for m in seen), seen
        _never_ran_after_release(second, k, release, marker)


def test_a_parked_key_exists_and_a_malformed_after_changes_nothing() -> None:
    with keeper() as k:
        conn = k.connect()
        argv, release = _held(k, "a")
        conn.call("spawn", **k.job(1, argv))
        rid = conn.send("spawn", **k.job(2, ["true"], after=AFTER_1))
        for again in (k.job(2, ["true"]), k.job(2, ["true"], after=AFTER_1)):
            with pytest.raises(KeeperError) as refused:
                conn.call("spawn", **again)
            assert refused.value.code == "exists"
        with pytest.raises(KeeperError) as refused:  # held as a record: refused, not parked
            conn.call("spawn", **k.job(1, ["true"], after={"job": 7, "attempt": 1}))
        assert refused.value.code == "exists"
        for after in (
            0,
            "1",
            [1, 1],
            {"job": 1},
            {"job": -1, "attempt": 1},
            {"job": 1, "attempt": 0},
            {"job": True, "attempt": 1},
            {"job": 1.0, "attempt": 1},
            {"job": 1, "attempt": 1, "keeper": "cpu"},
        ):
            with pytest.raises(KeeperError) as refused:
                conn.call("spawn", **k.job(3, ["true"], after=after))
            assert refused.value.code == "bad_request", after
        with pytest.raises(KeeperError) as refused:  # the spawn is checked before parking
            conn.call("spawn", **k.job(3, ["true"], cwd="relative", after=AFTER_1))
        assert refused.value.code == "bad_request"
        third = conn.send("spawn", **k.job(3, ["true"], after=AFTER_1))  # nothing held 3
        assert _jobs(conn) == [1]
        release()
        answers, _ = _answers(conn, rid, third)
        assert answers[rid]["ok"] and answers[third]["ok"]


def test_shutdown_is_refused_while_a_spawn_is_parked() -> None:
    with keeper() as k:
        conn = k.connect()
        argv, release = _held(k, "a")
        conn.call("spawn", **k.job(1, argv))
        rid = conn.send("spawn", **k.job(2, ["true"], after=AFTER_1))
        with pytest.raises(KeeperError) as refused:
            conn.call("shutdown")
        assert refused.value.code == "busy"
        assert "1 waiting to start" in refused.value.message
        kill = conn.send("kill", job=2, attempt=1, grace_s=5)
        answers, _ = _answers(conn, rid, kill)
        assert answers[rid]["error"]["code"] == "dropped"
        release()
        assert _exit_event(conn)["job"] == 1
        conn.call("ack", job=1, attempt=1)
        pid = k.pid
        conn.call("shutdown")
        wait_for(lambda: not alive(pid), "the keeper to leave")


def test_spawns_parked_on_one_attempt_start_in_arrival_order_as_any_spawn() -> None:
    """Each goes the way of a spawn sent then: a record and the exec's answer, or the
    reason it could not start."""
    with keeper() as k:
        conn = k.connect()
        argv, release = _held(k, "a")
        conn.call("spawn", **k.job(1, argv))
        marker = k.home / "b-ran"
        _busy_cgroup(k, 3)
        rids = [
            conn.send("spawn", **k.job(2, ["touch", str(marker)], after=AFTER_1)),
            conn.send("spawn", **k.job(3, ["true"], after=AFTER_1)),
            conn.send("spawn", **k.job(4, ["no-such-cmd"], after=AFTER_1)),
        ]
        assert _jobs(conn) == [1]
        release()
        answers, seen = _answers(conn, *rids)
        assert seen[0] == answers[rids[0]]  # started before 1's exit was synced
        exits = [m["job"]["job"] for m in seen if m.get("event") == "exit"]
        assert (exits or [_exit_event(conn)["job"]]) == [1]
        b, c, d = (answers[rid] for rid in rids)
        assert b["ok"] and b["job"]["job"] == 2
        assert c["error"]["code"] == "spawn"
        assert c["error"]["message"].startswith("cannot start the job yet: cgroup")
        assert d["error"] == {"code": "spawn", "message": "executable not found: no-such-cmd"}
        assert _starts(k) == [1, 2, 4]  # in arrival order; 3 never had a record
        wait_for(marker.exists, "the first parked job to run")


def test_attach_and_ping_announce_spawning_after_so_a_newer_daemon_knows_it_may() -> None:
    """Keepers outlive an upgrade: gpusvd sends `after` only to a keeper that announced
    it (an older keeper would start the job at once, beside the one it should follow)."""
    with keeper() as k:
        conn = k.connect(attach=False)
        assert "after" in conn.call("attach")["features"]
        assert "after" in conn.call("ping")["features"]


def test_a_spawn_after_one_that_waits_itself_starts_only_once_that_one_has_ended() -> None:
    """A chain: 2 waits for 1, 3 for 2. Job 1's exit starts 2, not 3; 2's exit starts 3."""
    with keeper() as k:
        conn = k.connect()
        argv1, release1 = _held(k, "a")
        argv2, release2 = _held(k, "b")
        conn.call("spawn", **k.job(1, argv1))
        rid2 = conn.send("spawn", **k.job(2, argv2, after=AFTER_1))
        rid3 = conn.send("spawn", **k.job(3, ["true"], after={"job": 2, "attempt": 1}))
        assert _jobs(conn) == [1]  # both parked
        release1()
        b = conn.reply(rid2)
        assert b["ok"], b
        assert _jobs(conn) == [1, 2]  # 3 still waits: 2 runs
        release2()
        c = conn.reply(rid3)
        assert c["ok"], c
        while (ended := _exit_event(conn))["job"] != 2:  # reported once synced, after c
            pass
        assert c["job"]["started_at"] >= ended["ended_at"]
        assert _starts(k) == [1, 2, 3]


def test_a_dropped_spawn_drops_the_chain_behind_it_and_nothing_of_it_runs() -> None:
    with keeper() as k:
        conn = k.connect()
        a, release, marker, rid2 = _one_held_one_parked(k, conn)
        marker3 = k.home / "c-ran"
        after_2 = {"job": 2, "attempt": 1}
        rid3 = conn.send("spawn", **k.job(3, ["touch", str(marker3)], after=after_2))
        kill_rid = conn.send("kill", job=2, attempt=1, grace_s=5)
        answers, _ = _answers(conn, rid2, rid3, kill_rid)
        assert answers[rid2]["error"] == DROPPED and answers[rid3]["error"] == DROPPED
        assert answers[kill_rid]["ok"] and alive(a["pid"])
        release()
        assert _exit_event(conn)["job"] == 1
        assert _jobs(conn) == [1] and _starts(k) == [1]
        assert not marker.exists() and not marker3.exists()


def test_a_spawn_refused_at_its_turn_drops_the_chain_behind_it() -> None:
    """What follows a job that never ran would otherwise wait for an exit that never
    comes."""
    with keeper() as k:
        conn = k.connect()
        argv, release = _held(k, "a")
        conn.call("spawn", **k.job(1, argv))
        _busy_cgroup(k, 2)
        rid2 = conn.send("spawn", **k.job(2, ["true"], after=AFTER_1))
        rid3 = conn.send("spawn", **k.job(3, ["true"], after={"job": 2, "attempt": 1}))
        assert _jobs(conn) == [1]
        release()
        answers, _ = _answers(conn, rid2, rid3)
        assert answers[rid2]["error"]["code"] == "spawn", answers[rid2]
        assert answers[rid3]["error"] == DROPPED
        assert _starts(k) == [1]
