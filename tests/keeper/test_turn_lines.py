"""What a keeper sends in one turn of its loop goes out together, in one `send` a
connection, at the points the loop flushes (Connections.held); a connection closed in
the turn still gets what was held for it. A request sent without an id (gpusvd's acks)
is answered only when it fails."""

from __future__ import annotations

import json
import selectors
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper.connections import Conn, Connections


class Counted:
    """A socket whose sends are counted (socket.socket's own methods are read-only)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sends = 0

    def send(self, data: bytes) -> int:
        self.sends += 1
        return self.sock.send(data)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def wired(tmp_path: Path) -> Iterator[tuple[Connections, Conn, Counted, socket.socket]]:
    sel = selectors.DefaultSelector()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    listener.listen()
    net = Connections(sel, listener, lambda message: None, lambda c, line: None, lambda c: None)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    counted = Counted(ours)
    conn = Conn(counted)  # type: ignore[arg-type]  # only send, fileno and close are used
    sel.register(ours, selectors.EVENT_READ, conn.ready)
    net.conns.add(conn)
    try:
        yield net, conn, counted, theirs
    finally:
        theirs.close()
        ours.close()
        listener.close()
        sel.close()


def _lines(theirs: socket.socket, n: int) -> list[dict[str, Any]]:
    theirs.settimeout(10)
    reader = theirs.makefile("rb")
    return [json.loads(reader.readline()) for _ in range(n)]


def test_a_turns_lines_go_out_in_one_send_when_the_loop_flushes(
    wired: tuple[Connections, Conn, Counted, socket.socket],
) -> None:
    net, conn, counted, theirs = wired
    net.held = True
    net.send(conn, {"id": 1, "ok": True})
    net.send(conn, {"event": "exit", "job": {"job": 1}})
    assert counted.sends == 0 and conn.outbox
    net.flush_held()
    assert counted.sends == 1 and not conn.outbox
    net.flush_held()  # nothing held: nothing sent
    assert counted.sends == 1
    assert [m.get("id", m.get("event")) for m in _lines(theirs, 2)] == [1, "exit"]


def test_unheld_each_line_goes_at_once(
    wired: tuple[Connections, Conn, Counted, socket.socket],
) -> None:
    net, conn, counted, theirs = wired
    net.send(conn, {"id": 1, "ok": True})
    net.send(conn, {"id": 2, "ok": True})
    assert counted.sends == 2
    assert [m["id"] for m in _lines(theirs, 2)] == [1, 2]


def test_a_connection_closed_in_the_turn_still_gets_what_was_held_for_it(
    wired: tuple[Connections, Conn, Counted, socket.socket],
) -> None:
    net, conn, counted, theirs = wired
    net.held = True
    net.send(conn, {"id": 7, "ok": True})
    net.close(conn)
    net.flush_held()  # closed: nothing more, and no error
    assert conn.closed and counted.sends == 1
    assert _lines(theirs, 1) == [{"id": 7, "ok": True}]
