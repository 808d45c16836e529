"""The daemon's end of a keeper connection: whole lines, however the bytes arrive."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon.running import keeper_calls, keeper_wire, keepers
from supervisor.daemon.running.keeper_wire import Wire

from .transport import Transport


def wire() -> tuple[Wire, list[dict[str, Any]], Transport]:
    got: list[dict[str, Any]] = []
    w = Wire("cpu", got.append)
    t = Transport()
    w.connection_made(t)
    return w, got, t


def test_lines_split_across_reads_and_several_in_one_read_each_arrive_whole() -> None:
    w, got, t = wire()
    a, b, c = (json.dumps({"id": i, "ok": True}).encode() + b"\n" for i in (1, 2, 3))
    w.data_received(a[:5])
    assert got == []
    w.data_received(a[5:] + b + c[:-1])
    assert [m["id"] for m in got] == [1, 2]
    w.data_received(c[-1:])
    assert [m["id"] for m in got] == [1, 2, 3] and w.buffer == b""
    assert not t.closed


@pytest.mark.parametrize("line", [b"{not json\n", b"[1, 2]\n", b'"text"\n', b"\xff\xfe\n"])
def test_a_line_that_is_not_a_message_is_skipped_and_the_connection_kept(line: bytes) -> None:
    w, got, t = wire()
    w.data_received(b'{"id": 1}\n' + line + b'{"id": 2}\n')
    assert got == [{"id": 1}, {"id": 2}] and not t.closed
    assert w.write(b"{}\n") and t.sent == [b"{}\n"]  # and the connection still carries


def test_a_message_its_handler_fails_on_is_skipped_and_the_connection_kept() -> None:
    got: list[dict[str, Any]] = []

    def handle(message: dict[str, Any]) -> None:
        got.append(message)
        _ = message["job"]["id"]  # a KeyError for the first: a bug of ours, not the keeper's

    w, t = Wire("cpu", handle), Transport()
    w.connection_made(t)
    w.data_received(b'{"event": "exit"}\n{"event": "exit", "job": {"id": 7}}\n')
    assert [m.get("job") for m in got] == [None, {"id": 7}] and not t.closed


async def test_an_exit_event_with_a_malformed_record_leaves_the_keepers_other_jobs_alone() -> None:
    """Through the daemon's real handler: the bad exit is skipped, the keeper is not
    taken for dead, and the next exit still reaches its job's watcher."""
    keeper = keepers.wired("cpu", Path("/nonexistent"))
    t = Transport()
    keeper.wire.connection_made(t)
    good = {"job": 5, "attempt": 1, "pid": 10, "start_ticks": 1, "started_at": 1.0, "ended_at": 2.0}
    keeper.wire.data_received(
        b'{"event": "exit", "job": {"no": "fields"}}\n'
        + json.dumps({"event": "exit", "job": good}).encode()
        + b"\n"
    )
    assert not keeper.gone and not t.closed
    assert list(keeper._ended) == [(5, 1)]


def test_a_line_longer_than_the_limit_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keeper_wire, "MAX_LINE", 10)
    w, got, t = wire()
    w.data_received(b'{"id": 1, "padding": "')
    assert t.closed and got == []


def test_the_end_of_the_connection_is_told_once_it_is_lost() -> None:
    w, _, _ = wire()
    lost: list[bool] = []
    w.on_lost = lambda: lost.append(True)
    w.connection_lost(None)
    assert lost == [True]


def test_a_drop_asked_before_its_spawn_is_sent_follows_the_spawn() -> None:
    sent: list[str] = []
    drop = keepers.Drop()
    drop.ask()
    assert sent == []
    drop.arm(lambda: sent.append("kill"))  # the spawn is on its connection now
    assert sent == ["kill"]


def test_a_drop_is_sent_once_at_the_first_ask_and_never_once_the_spawn_was_answered() -> None:
    sent: list[str] = []
    drop = keepers.Drop()
    drop.arm(lambda: sent.append("kill"))
    drop.ask()
    drop.ask()
    assert sent == ["kill"]
    answered = keepers.Drop()
    answered.arm(lambda: sent.append("late"))
    answered.arm(None)  # answered: it ran, or was refused; a kill goes through Kill orders
    answered.ask()
    assert sent == ["kill"]


async def test_a_skipped_line_has_the_list_read_again_and_an_unreadable_record_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a skipped line, one `list` goes out; the exits its answer holds reach those
    who wait for them, a record unreadable there too is only logged, and while even the
    answers are skipped the lists come ever more slowly."""
    monkeypatch.setattr(keeper_calls, "RELIST_S", 0.01)
    keeper = keepers.wired("cpu", Path("/nonexistent"))
    keeper._relist_s = keeper_calls.RELIST_S
    w = keeper.wire
    t = Transport()
    w.connection_made(t)
    waiter = asyncio.ensure_future(keeper.ended((5, 1)))
    await asyncio.sleep(0)
    w.data_received(b"{garbled exit\n{also garbled\n")  # two skips, one list
    await asyncio.sleep(0.05)
    lists = [json.loads(s) for s in t.sent]
    assert [m["op"] for m in lists] == ["list"]
    good = {"job": 5, "attempt": 1, "pid": 10, "start_ticks": 1, "started_at": 1.0, "ended_at": 2.0}
    answer = {"id": lists[0]["id"], "ok": True, "jobs": [{"no": "fields"}, good]}
    w.data_received(json.dumps(answer).encode() + b"\n")
    assert (await asyncio.wait_for(waiter, 1)).key == (5, 1)
    assert keeper._relist_s == keeper_calls.RELIST_S and not keeper._relist_due  # nothing more due
    for _ in range(3):  # answers that cannot be read either: each wait twice as long
        w.data_received(b"{garbled\n")
    assert keeper._relist_s == 2 * keeper_calls.RELIST_S
