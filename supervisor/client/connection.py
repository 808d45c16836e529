"""The client side of the socket protocol: one connection, requests one at a time.

Used by the `gpusv` CLI, the bench and the tests. It imports json, _socket and the framing
only (no typing, pathlib or contextlib at run time): every command pays for its imports.
"""

from __future__ import annotations

import json
import os

# The socket module's own class, without socket.py: that module builds four IntEnums of
# _socket's constants when imported, which cost `gpusv list` about 4 ms on a small VM
# (more than its own code). socket.socket is a thin subclass of this one; connect,
# sendall, recv and close are the C methods either way.
from _socket import AF_UNIX, SOCK_STREAM
from _socket import socket as Socket

from supervisor.wire import framing

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    SocketPath = str | os.PathLike[str]


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

    def __init__(self, path: SocketPath | Sequence[SocketPath]) -> None:
        self.paths: list[SocketPath] = [path] if isinstance(path, str | os.PathLike) else list(path)
        self.path = self.paths[0]
        self.sock: Socket | None = None
        self.buf = b""

    def _connect(self) -> Socket:
        if self.sock is None:
            tried: list[str] = []
            denied = False
            for path in self.paths:
                sock = Socket(AF_UNIX, SOCK_STREAM)
                try:
                    sock.connect(os.fspath(path))
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
            try:  # noqa: SIM105 (contextlib.suppress: an import the CLI does without)
                sock.sendall(framing.encode(request))
            except BrokenPipeError:
                pass  # refused (busy) and closed before it read: its answer is there to read
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
