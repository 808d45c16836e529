"""The client side of the socket protocol: one connection, requests one at a time.

Used by the `gpusv` CLI, the bench and the tests; imports only the framing.
"""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

from supervisor.wire import framing


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Unreachable(Exception):
    def __init__(self, message: str, *, maybe_sent: bool = False) -> None:
        super().__init__(message)
        self.maybe_sent = maybe_sent  # the daemon may have got (and done) the request


class Client:
    """One connection for the whole command; requests go one at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> socket.socket:
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                raise Unreachable(
                    f"gpusvd is not running (no daemon at {self.path}); start it with "
                    "`gpusvd` or `systemctl start gpusvd`"
                ) from None
            except PermissionError:
                sock.close()
                raise Unreachable(
                    f"permission denied on {self.path}: ask for the socket's group"
                ) from None
            self.sock = sock
        return self.sock

    def reset(self) -> None:
        """Drop the connection; the next call connects again."""
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        sock = self._connect()
        request.setdefault("version", framing.VERSION)
        try:
            # Refused (busy) and closed before it read: its answer is still there to read.
            with contextlib.suppress(BrokenPipeError):
                sock.sendall(framing.encode(request))
            while b"\n" not in self.buf:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise Unreachable("gpusvd closed the connection", maybe_sent=True)
                self.buf += chunk
        except (BrokenPipeError, ConnectionResetError):
            raise Unreachable("gpusvd closed the connection", maybe_sent=True) from None
        line, _, self.buf = self.buf.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise Refused(err.get("code", "error"), err.get("message", "request refused"))
        return reply
