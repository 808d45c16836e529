"""When a keeper syncs an exit: an attached gpusvd is told at the end of the turn that
wrote it, with no fdatasync, since it commits the exit before anything acts on it and
then acknowledges it; an exit it leaves unacknowledged for SYNC_GRACE_S is synced, and
with no gpusvd attached (or the attached one gone) an exit is synced before anyone is
told. A real job (`true`), a real journal file; fdatasync is counted."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper import cgroup, server
from supervisor.keeper.jobs import Jobs
from supervisor.keeper.journal import Journal
from supervisor.keeper.server import Conn, Server
from supervisor.keeper.spawn import Spec


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    return calls


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[Server, Conn, socket.socket]]:
    """A keeper's Server in this process (no cgroups), one connection on a socketpair;
    the process gets its own signal handlers back afterwards."""
    saved = {
        s: signal.getsignal(s)
        for s in (signal.SIGCHLD, signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
    }
    jobs = Jobs(Journal(tmp_path / "journal"), cgroup.Roots(), lambda message: None)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    listener.listen()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        keeper = Server(jobs, listener, lambda message: None)
        conn = Conn(ours)
        keeper.conns.add(conn)
        yield keeper, conn, theirs
    finally:
        signal.set_wakeup_fd(-1)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sock in (ours, theirs, listener):
            sock.close()


def _run_true(keeper: Server, tmp: Path, job: int) -> None:
    """A job that exits at once, reaped and its exit written in one turn."""
    out = str(tmp / f"{job}.out")
    spec = Spec(job, 1, ("true",), "/tmp", {"PATH": "/usr/bin:/bin"}, out, out)
    keeper._start(spec, lambda answer: None)
    deadline = time.monotonic() + 30
    while not keeper.jobs.journal.records[(job, 1)].ended:
        assert time.monotonic() < deadline, "the job's exit was never recorded"
        keeper.jobs.reap_all()
        time.sleep(0.005)


def _turn(keeper: Server) -> None:
    """The end of a turn of the keeper's loop: write (sync if due), then send."""
    keeper._sync()
    keeper.net.flush_held()


def _events(theirs: socket.socket) -> list[dict[str, Any]]:
    theirs.settimeout(0.2)
    data = b""
    try:
        while chunk := theirs.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    lines = [json.loads(line) for line in data.splitlines()]
    return [line for line in lines if "event" in line]


def _told_unsynced(keeper: Server, conn: Conn, theirs: socket.socket, tmp: Path) -> None:
    """gpusvd attached on `conn`; a job ran and its exit was told to it, not synced."""
    keeper.attached = conn
    _run_true(keeper, tmp, 1)
    _turn(keeper)
    (event,) = _events(theirs)
    assert event["event"] == "exit" and event["job"]["exit_code"] == 0


def test_an_attached_gpusvd_is_told_of_an_exit_without_a_sync_and_its_ack_needs_none(
    tmp_path: Path, serving: tuple[Server, Conn, socket.socket], synced: list[int]
) -> None:
    keeper, conn, theirs = serving
    _told_unsynced(keeper, conn, theirs, tmp_path)
    assert synced == []  # told once written: gpusvd commits it before it acts on it
    assert b'"e":"exit","job":1' in (tmp_path / "journal").read_bytes()
    keeper._request(conn, b'{"op": "ack", "job": 1, "attempt": 1}')
    _turn(keeper)
    assert synced == [] and keeper.jobs.journal.unsynced == {}
    assert keeper.jobs.journal.sync_deadline(server.SYNC_GRACE_S) is None


def test_an_exit_left_unacknowledged_for_the_grace_is_synced(
    tmp_path: Path, serving: tuple[Server, Conn, socket.socket], synced: list[int]
) -> None:
    keeper, conn, theirs = serving
    _told_unsynced(keeper, conn, theirs, tmp_path)
    assert synced == []
    due = keeper.jobs.journal.sync_deadline(server.SYNC_GRACE_S)
    assert due is not None and due <= time.monotonic() + server.SYNC_GRACE_S
    time.sleep(max(0.0, due - time.monotonic()))
    _turn(keeper)  # the loop wakes for it (serve's timeout)
    assert len(synced) == 1 and keeper.jobs.journal.unsynced == {}
    _turn(keeper)
    assert len(synced) == 1  # synced once, not again at every turn


def test_with_no_gpusvd_attached_an_exit_is_synced_before_anyone_is_told(
    tmp_path: Path, serving: tuple[Server, Conn, socket.socket], synced: list[int]
) -> None:
    keeper, conn, _ = serving
    _run_true(keeper, tmp_path, 1)
    listed: list[int] = []
    keeper.net.send = lambda c, msg: listed.append(len(synced))  # type: ignore[method-assign,assignment]
    keeper._request(conn, b'{"id": 1, "op": "list"}')  # a client that is not gpusvd
    _turn(keeper)
    assert listed == [1]  # answered with the exit after its sync
    assert keeper.jobs.journal.unsynced == {}


def test_an_exit_told_to_a_gpusvd_that_then_went_away_is_synced_at_the_next_turn(
    tmp_path: Path, serving: tuple[Server, Conn, socket.socket], synced: list[int]
) -> None:
    keeper, conn, theirs = serving
    _told_unsynced(keeper, conn, theirs, tmp_path)
    assert synced == []
    keeper.net.close(conn)  # gpusvd died before it committed and acknowledged it
    _turn(keeper)
    assert len(synced) == 1 and keeper.jobs.journal.unsynced == {}


def test_a_sync_the_disk_refuses_is_tried_again_after_a_pause_not_at_every_turn(
    tmp_path: Path, serving: tuple[Server, Conn, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper, _, _ = serving
    tries: list[int] = []

    def refuse(fd: int) -> None:
        tries.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", refuse)
    _run_true(keeper, tmp_path, 1)  # no gpusvd attached: its exit is due for a sync at once
    _turn(keeper)
    assert len(tries) == 1 and keeper.jobs.journal.unsynced  # still owed
    timeout = keeper._timeout(None)
    assert timeout is not None and timeout > server.PENDING_RETRY_S / 2  # the loop waits
    _turn(keeper)
    assert len(tries) == 1  # not again before the pause is over
    keeper.sync_retry_at = time.monotonic()  # the pause is over
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    _turn(keeper)
    assert keeper.jobs.journal.unsynced == {}
