"""The bytes of one keeper connection, on asyncio's own transport: whole lines in,
lines out, and a line that cannot be read is skipped, never the connection closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from supervisor.wire import jsonline

log = structlog.get_logger("gpusvd.keepers")

MAX_LINE = 64 * 1024 * 1024  # `list` of a keeper with many unacknowledged records


class Wire(asyncio.Protocol):
    """A keeper connection's bytes, on asyncio's own transport: each whole line goes to
    `on_message` from the loop's read callback, and a write is one `send`, with no task
    in between. (anyio's socket stream registers the socket with the selector anew for
    every read: two epoll calls and a task wake-up per message, three messages a job.)"""

    def __init__(self, name: str, on_message: Callable[[dict[str, Any]], None]) -> None:
        self.name = name
        self.on_message = on_message
        self.on_lost: Callable[[], None] = lambda: None
        self.on_skipped: Callable[[], None] = lambda: None
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        start = 0
        while (end := self.buffer.find(b"\n", start)) >= 0:
            line, start = bytes(self.buffer[start:end]), end + 1
            self._take(line)
        del self.buffer[:start]
        if len(self.buffer) > MAX_LINE:
            log.error("keeper line too long", keeper=self.name, bytes=len(self.buffer))
            self.close()

    def _take(self, line: bytes) -> None:
        """One line, whatever is wrong with it, never costs the connection: closing it
        would end every job of that keeper as `interrupted` (its watchers take a lost
        connection for a dead keeper). An exit that could not be taken stays unacknowledged
        in the keeper's journal, and `on_skipped` has the keeper's list read again."""
        try:
            message = jsonline.decode(line)
        except ValueError as exc:
            log.error("keeper sent a bad line", keeper=self.name, error=repr(exc), line=line[:200])
            self.on_skipped()
            return
        if not isinstance(message, dict):
            log.error("keeper sent a bad line", keeper=self.name, line=line[:200])
            self.on_skipped()
            return
        try:
            self.on_message(message)
        except Exception:
            log.exception(
                "a keeper's message could not be taken", keeper=self.name, line=line[:200]
            )
            self.on_skipped()

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost()

    def write(self, data: bytes) -> bool:
        """Whether it was handed to the transport (False once the connection closes)."""
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(data)
        return True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
