"""The client side of the socket protocol: one connection, requests one at a time.

Used by the `gpusv` CLI, the bench and the tests; imports only the framing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Sequence
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
    """One connection for the whole command; requests go one at a time.

    Given several socket paths, it connects to the first that answers and, when none
    does, says what it tried and why each failed."""

    def __init__(self, path: str | os.PathLike[str] | Sequence[Path]) -> None:
        if isinstance(path, str | os.PathLike):
            self.paths = [Path(path)]
        else:
            self.paths = [Path(p) for p in path]
        self.path = self.paths[0]
        self.sock: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> socket.socket:
        if self.sock is None:
            tried: list[str] = []
            denied = False
            for path in self.paths:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(str(path))
                except (FileNotFoundError, ConnectionRefusedError) as exc:
                    sock.close()
                    why = "no such socket" if isinstance(exc, FileNotFoundError) else "refused"
                    tried.append(f"{path} ({why})")
                    continue
                except PermissionError:
                    sock.close()
                    tried.append(f"{path} (permission denied)")
                    denied = True
                    continue
                self.sock, self.path = sock, path
                return sock
            if denied:
                raise Unreachable(
                    f"cannot reach gpusvd: tried {', '.join(tried)}; ask to join the "
                    "socket's group (socket_group in /etc/gpusvd.toml)"
                )
            raise Unreachable(
                f"gpusvd is not running: tried {', '.join(tried)}; start it with `gpusvd` "
                "or `systemctl start gpusvd`, or point GPUSV_SOCKET at its socket"
            )
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
