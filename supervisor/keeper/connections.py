"""The keeper's connections: accepting them (only from its own user), their bytes in
and out, whole lines to the server, and a line over the limit answered and skipped."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from supervisor.wire.framing import MAX_KEEPER_LINE as MAX_LINE
from supervisor.wire.framing import encode as _line

MAX_OUTBOX = 64 * 1024 * 1024  # a client that reads nothing loses its connection, not us
ACCEPT_PAUSE_S = 1.0  # after accept() failed (EMFILE): the listener rests, the loop runs on
_ID = re.compile(rb'\{"id":(\d{1,18})[,}]')  # a line's id, read before the line is whole


def err(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


class Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = b""
        self.skipping = False  # inside a line over the limit: its bytes go unread
        self.outbox = b""
        self.closed = False
        self.writing = False  # registered for EVENT_WRITE: the outbox waits on the peer
        self.ready: Callable[[], None] = lambda: None  # the selector's callback


class Connections:
    def __init__(
        self,
        sel: selectors.BaseSelector,
        listener: socket.socket,
        log: Callable[[str], None],
        on_line: Callable[[Conn, bytes], None],
        on_close: Callable[[Conn], None],
    ) -> None:
        self.sel, self.listener, self.log = sel, listener, log
        self.on_line, self.on_close = on_line, on_close
        self.conns: set[Conn] = set()
        # Held: what a turn of the loop sends goes out at its end, one `send` a connection
        # for all of a turn's lines (the server holds while it serves; unheld, at once).
        self.held = False
        self._to_flush: list[Conn] = []
        self.paused_until = 0.0  # accept() failed: not listening until then
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ, self.accept)

    def resume_accepting(self) -> None:
        if self.paused_until and time.monotonic() >= self.paused_until:
            self.paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ, self.accept)

    # -- connections ------------------------------------------------------------------

    def accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EMFILE and the like: the jobs matter more than a client
            # The listener rests a while, off the selector: the loop serves the jobs and
            # the connections it has, with no sleep, and the log gets a line a second.
            self.log(f"accept failed: {exc.strerror}; not accepting for {ACCEPT_PAUSE_S:g}s")
            self.sel.unregister(self.listener)
            self.paused_until = time.monotonic() + ACCEPT_PAUSE_S
            return
        try:
            self._admit(sock)
        except OSError as exc:
            self.log(f"a connection could not be set up: {exc.strerror}")
            sock.close()

    def _admit(self, sock: socket.socket) -> None:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.geteuid():
            self.log(f"refused a connection from uid {uid} (pid {pid})")
            refusal = {"id": None, "ok": False, "error": err("forbidden", "not the keeper's user")}
            with contextlib.suppress(OSError):
                sock.send(_line(refusal))
            sock.close()
            return
        sock.setblocking(False)
        conn = Conn(sock)
        conn.ready = lambda: self._ready(conn)
        self.conns.add(conn)
        self.sel.register(sock, selectors.EVENT_READ, conn.ready)

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close(conn)
            return
        if conn.skipping:  # the rest of a line over the limit: dropped up to its end
            end = data.find(b"\n")
            if end < 0:
                return
            conn.skipping, data = False, data[end + 1 :]
        conn.inbox += data
        while not conn.closed and b"\n" in conn.inbox:
            line, conn.inbox = conn.inbox.split(b"\n", 1)
            if len(line) > MAX_LINE:
                self._too_large(conn, line)
            else:
                self.on_line(conn, line)
        if len(conn.inbox) > MAX_LINE:
            self._too_large(conn, conn.inbox)
            conn.inbox, conn.skipping = b"", True

    def _too_large(self, conn: Conn, head: bytes) -> None:
        """A line over the limit is answered, by its id where its first bytes give one,
        and skipped to its end: the connection, and every job it watches, goes on."""
        found = _ID.match(head[:64])
        rid = int(found[1]) if found else None
        self.log(f"a request line over {MAX_LINE} bytes (id {rid}): refused")
        message = f"request line over {MAX_LINE} bytes"
        self.send(conn, {"id": rid, "ok": False, "error": err("too_large", message)})

    def send(self, conn: Conn, obj: dict[str, Any]) -> None:
        if conn.closed:
            return
        if not conn.outbox and self.held:
            self._to_flush.append(conn)
        conn.outbox += _line(obj)
        if not self.held:
            self._flush(conn)

    def flush_held(self) -> None:
        """Send what the turn held back so far: one `send` for each connection (one that
        raised leaves the others listed for the next flush, not forgotten)."""
        while self._to_flush:
            conn = self._to_flush.pop()
            if not conn.closed and conn.outbox and not conn.writing:
                self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        try:
            while conn.outbox:
                sent = conn.sock.send(conn.outbox)
                conn.outbox = conn.outbox[sent:]
        except (BlockingIOError, InterruptedError):
            if len(conn.outbox) > MAX_OUTBOX:
                self.log("a client reads nothing: connection closed")
                self.close(conn)
                return
        except OSError:
            self.close(conn)
            return
        if conn.writing != bool(conn.outbox):  # else the registration is right already
            conn.writing = bool(conn.outbox)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self.sel.modify(conn.sock, events, conn.ready)

    def _ready(self, conn: Conn) -> None:
        if conn.outbox:
            self._flush(conn)
        if not conn.closed:
            self._read(conn)

    def close(self, conn: Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.outbox:  # what the turn held for it goes as it would have gone at once
            with contextlib.suppress(OSError):
                conn.sock.send(conn.outbox)
        self.conns.discard(conn)
        self.on_close(conn)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()

    def pending_output(self) -> bool:
        return any(c.outbox for c in self.conns)
