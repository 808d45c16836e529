"""The Unix-socket server: framing, limits, peer credentials. Requests go to a handler.

Stale-socket probe, then bind (under a umask that leaves the socket private until its
mode is set), chmod, chgrp, listen. Every connection's identity comes from SO_PEERCRED;
what a client says about itself is never trusted.
"""

from __future__ import annotations

import contextlib
import grp
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from . import protocol
from .protocol import ProtocolError, Request

log = structlog.get_logger("gpusvd.server")


@dataclass(frozen=True)
class Peer:
    uid: int
    gid: int
    pid: int


Handler = Callable[[Request, Peer], Awaitable[dict[str, Any]]]


class AlreadyRunning(RuntimeError):
    pass


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(uid=uid, gid=gid, pid=pid)


def probe_stale(path: Path) -> None:
    """Remove a socket left by a dead daemon; refuse to steal one a live daemon serves."""
    if not path.exists() and not path.is_symlink():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    except OSError as exc:
        raise AlreadyRunning(f"cannot probe existing socket {path}: {exc.strerror}") from None
    finally:
        probe.close()
    raise AlreadyRunning(f"another gpusvd is already serving {path}")


async def bind(path: Path, mode: int, group: str) -> anyio.abc.SocketListener:
    path.parent.mkdir(parents=True, exist_ok=True)
    probe_stale(path)
    old = os.umask(0o177)
    try:
        listener = await anyio.create_unix_listener(path)
    finally:
        os.umask(old)
    if group:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    os.chmod(path, mode)
    return listener


class Server:
    def __init__(
        self,
        path: Path,
        handler: Handler,
        *,
        mode: int = 0o660,
        group: str = "",
        admit: Callable[[Peer], str | None] = lambda _peer: None,
        max_connections: int = 256,
        idle_timeout_s: float = 30.0,
    ) -> None:
        self.path = path
        self.handler = handler
        self.mode = mode
        self.group = group
        self.admit = admit
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.connections = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await bind(self.path, self.mode, self.group)
        log.info("listening", socket=str(self.path), mode=oct(self.mode))
        try:
            async with listener:
                task_status.started()
                await listener.serve(self._connection)
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def _send(self, conn: anyio.abc.SocketStream, obj: dict[str, Any]) -> None:
        with anyio.move_on_after(self.idle_timeout_s):
            await conn.send(protocol.encode(obj))

    async def _connection(self, conn: anyio.abc.SocketStream) -> None:
        async with conn:
            self.connections += 1
            try:
                await self._serve(conn)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
                pass
            finally:
                self.connections -= 1

    async def _serve(self, conn: anyio.abc.SocketStream) -> None:
        if self.connections > self.max_connections:
            await self._send(conn, ProtocolError(protocol.BUSY, "too many connections").to_json())
            return
        peer = peer_of(conn.extra(anyio.abc.SocketAttribute.raw_socket))
        refused = self.admit(peer)
        if refused is not None:
            await self._send(conn, ProtocolError(protocol.FORBIDDEN, refused).to_json())
            return
        reader = BufferedByteReceiveStream(conn)
        while True:
            try:
                with anyio.fail_after(self.idle_timeout_s):
                    line = await reader.receive_until(b"\n", protocol.MAX_LINE)
            except TimeoutError:
                return
            except (anyio.IncompleteRead, anyio.EndOfStream):
                return
            except anyio.DelimiterNotFound:
                err = ProtocolError(protocol.TOO_LARGE, f"request over {protocol.MAX_LINE} bytes")
                await self._send(conn, err.to_json())
                return
            await self._send(conn, await self._answer(line, peer))

    async def _answer(self, line: bytes, peer: Peer) -> dict[str, Any]:
        try:
            request = protocol.decode_request(line)
            return await self.handler(request, peer)
        except ProtocolError as exc:
            return exc.to_json()
        except Exception as exc:  # a bug in one request must not take the daemon down
            log.exception("request failed", peer_uid=peer.uid)
            return ProtocolError(protocol.INTERNAL, f"internal error: {exc!r}").to_json()
