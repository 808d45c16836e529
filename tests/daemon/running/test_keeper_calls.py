"""gpusvd's calls to a keeper: one encoding and limit, a deadline on each, a spawn
answered from the records when its connection was lost, passing failures told apart."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon.running import keeper_link, keepers
from supervisor.daemon.running.keepers import _passing
from supervisor.keeper.client import KeeperError
from supervisor.keeper.journal import record_from
from supervisor.wire.framing import MAX_KEEPER_LINE

from .transport import Transport


def _keeper() -> tuple[keepers.Keeper, Transport]:
    keeper = keepers.wired("cpu", Path("/nonexistent"))
    t = Transport()
    keeper.wire.connection_made(t)
    return keeper, t


async def test_lines_go_out_in_utf8_as_a_client_sends_them_and_over_the_limit_never() -> None:
    keeper, t = _keeper()
    await keeper.tell("ping", note="é")
    assert "é".encode() in t.sent[0] and b"\\u00e9" not in t.sent[0]
    assert "id" not in json.loads(t.sent[0])  # a tell: answered only if it fails
    keeper.ping(1.0)  # a ping's answer is the point: it goes with an id
    assert json.loads(t.sent[1])["id"] >= 1
    with pytest.raises(KeeperError) as refused:
        await keeper.call("spawn", env={"BIG": "x" * MAX_KEEPER_LINE}, job=1, attempt=1)
    assert refused.value.code == "too_large" and len(t.sent) == 2  # nothing sent
    assert keeper._replies == {}


async def test_a_spawn_says_when_it_is_on_the_connection_and_not_when_it_was_refused() -> None:
    keeper, t = _keeper()
    written: list[int] = []
    call = asyncio.ensure_future(
        keeper.call("spawn", written=lambda: written.append(len(t.sent)), job=1, attempt=1)
    )
    await asyncio.sleep(0)
    assert written == [1]  # once its line was on the connection, before any answer
    call.cancel()
    with pytest.raises(KeeperError):
        env = {"BIG": "x" * MAX_KEEPER_LINE}
        await keeper.call("spawn", written=lambda: written.append(0), env=env, job=2, attempt=1)
    assert written == [1]


async def test_a_call_unanswered_past_its_deadline_fails_and_the_keeper_is_said_stuck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keeper_link, "CALL_DEADLINE_S", 0.05)
    stuck: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        keeper_link,
        "keeper_stuck",
        lambda name, op, waited, *, still_waiting: stuck.append((op, still_waiting)),
    )
    keeper, t = _keeper()
    with pytest.raises(KeeperError) as late:
        await keeper.call("procs", job=1, attempt=1)
    assert late.value.code == "timeout" and stuck == [("procs", False)]
    assert keeper._replies == {} and not keeper.gone
    # A spawn waits on past its deadline (its job may have started), and is said stuck.
    spawn = asyncio.ensure_future(keeper.call("spawn", job=2, attempt=1))
    await asyncio.sleep(0.2)
    assert not spawn.done() and stuck[-1] == ("spawn", True)
    rid = json.loads(t.sent[-1])["id"]
    record = {"job": 2, "attempt": 1, "pid": 9, "start_ticks": 1, "started_at": 1.0}
    keeper.wire.data_received(json.dumps({"id": rid, "ok": True, "job": record}).encode() + b"\n")
    assert (await asyncio.wait_for(spawn, 5))["job"]["pid"] == 9


async def test_a_spawn_in_flight_when_the_connection_closes_is_answered_from_the_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keeper lives: gpusvd attaches again. A spawn it ran is answered with its
    record; one it never read is a passing failure (the attach closed that connection,
    so it never will be read); any other call in flight fails at once."""
    keeper, _ = _keeper()
    keeper.pidfd = os.pidfd_open(os.getpid())  # a keeper process that lives
    attached: list[dict[str, Any]] = []

    async def reattach() -> None:
        record = {"job": 1, "attempt": 1, "pid": 7, "start_ticks": 1, "started_at": 1.0}
        attached.append(record)
        for rid, key in list(keeper._spawning.items()):
            keeper._answered_by(rid, record_from(record) if key == (1, 1) else None)
        back, keeper._back = keeper._back, None
        assert back is not None
        back.set()

    monkeypatch.setattr(keeper, "_reattach", reattach)
    ran = asyncio.ensure_future(keeper.call("spawn", job=1, attempt=1))
    unread = asyncio.ensure_future(keeper.call("spawn", job=2, attempt=1))
    other = asyncio.ensure_future(keeper.call("memory", job=1, attempt=1))
    await asyncio.sleep(0.01)
    keeper.wire.connection_lost(None)
    assert (await asyncio.wait_for(ran, 5))["job"]["pid"] == 7
    with pytest.raises(KeeperError) as refused:
        await asyncio.wait_for(unread, 5)
    assert refused.value.code == "spawn" and refused.value.transient
    with pytest.raises(keepers.KeeperGone):
        await asyncio.wait_for(other, 5)
    assert not keeper.gone and attached
    os.close(keeper.pidfd)


async def test_a_connection_lost_with_the_keeper_process_gone_is_a_keeper_lost() -> None:
    keeper, _ = _keeper()  # no pidfd: nothing says it lives
    waiter = asyncio.ensure_future(keeper.ended((1, 1)))
    await asyncio.sleep(0)
    keeper.wire.connection_lost(None)
    with pytest.raises(keepers.KeeperGone):
        await asyncio.wait_for(waiter, 5)
    assert keeper.gone


def test_which_refusals_may_pass() -> None:
    assert _passing(KeeperError("spawn", "EAGAIN", transient=True))
    assert _passing(KeeperError("timeout", "no answer"))
    assert _passing(KeeperError("start", "keeper exited 1"))
    assert not _passing(KeeperError("spawn", "executable not found: x"))
    assert not _passing(KeeperError("too_large", "a spawn of 2000000 bytes"))


async def test_calls_that_wait_for_a_new_connection_fail_once_the_keeper_is_found_gone() -> None:
    """The connection closes while the keeper lives: calls wait for the new one. The
    keeper then dies before it could be reached: they fail at once, and its jobs'
    watchers learn that their keeper is lost."""
    proc = await asyncio.create_subprocess_exec("sleep", "300")
    keeper, _ = _keeper()  # its socket does not exist: every new connection fails
    keeper.pidfd = os.pidfd_open(proc.pid)
    try:
        watcher = asyncio.ensure_future(keeper.ended((1, 1)))
        await asyncio.sleep(0)
        keeper.wire.connection_lost(None)
        assert not keeper.gone and keeper._back is not None
        waiting = asyncio.ensure_future(keeper.call("ping"))
        await asyncio.sleep(0.1)
        assert not waiting.done() and not watcher.done()  # a live keeper: jobs kept
        proc.kill()
        await proc.wait()
        with pytest.raises(keepers.KeeperGone):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(keepers.KeeperGone):
            await asyncio.wait_for(watcher, 5)
        assert keeper.gone
    finally:
        os.close(keeper.pidfd)
