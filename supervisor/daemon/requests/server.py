"""The Unix-socket server: framing, limits, peer credentials. Requests go to a handler.

Stale-socket probe, then bind (under a umask that leaves the socket private until its
mode is set), chmod, chgrp, listen. Every connection's identity comes from SO_PEERCRED;
what a client says about itself is never trusted.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor.daemon.clock import monotonic
from supervisor.daemon.requests.connections import Connections, Held
from supervisor.wire import protocol
from supervisor.wire.protocol import ProtocolError, Request

log = structlog.get_logger("gpusvd.server")


@dataclass(frozen=True)
class Peer:
    uid: int
    gid: int
    pid: int
    conn: int = 0  # which connection: what `run` jobs are tied to


Handler = Callable[[Request, Peer], Awaitable[dict[str, Any]]]

# A request line or an answer this large leaves the heap with megabytes of freed chunks
# that glibc keeps: after it is answered, the daemon gives them back (`Server.after_big`).
BIG = 256 * 1024


class Pieces:
    """A list in an answer, made and sent a piece at a time: the answer's line is the one
    `protocol.encode` would give, but neither the whole list nor its text is ever held (a
    dry run of 100,000 jobs answers with 60 MB of job views)."""

    def __init__(self, pieces: Iterable[list[Any]]) -> None:
        self.pieces = pieces


def frames(obj: dict[str, Any]) -> Iterator[bytes]:
    """`protocol.encode(obj)` in parts, a `Pieces` value's list a piece at a time."""
    if not any(isinstance(v, Pieces) for v in obj.values()):
        yield protocol.encode(obj)
        return
    head = b"{"
    for i, (key, value) in enumerate(obj.items()):
        comma = b"," if i else b""
        if not isinstance(value, Pieces):
            head += comma + protocol.encode({key: value})[1:-2]  # b'"key":value'
            continue
        yield head + comma + protocol.encode({key: []})[1:-3]  # b'"key":['
        head, first = b"", True
        for piece in value.pieces:
            if piece:
                # b'{"":[a,b]}\n' -> b'a,b'
                yield (b"" if first else b",") + protocol.encode({"": piece})[5:-3]
                first = False
        head = b"]"
    yield head + b"}\n"


class StartupError(RuntimeError):
    """The socket cannot be served: gpusvd prints this one line and exits 2."""


class AlreadyRunning(StartupError):
    """Another gpusvd answers on the socket."""


REFUSED_READ = 64 * 1024  # what a refused client may still send before it is cut off
# A full descriptor table is a pressure to wait out, not a reason to stop serving.
_ACCEPT_RETRY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


async def _nothing(_peer: Peer) -> None:
    return None


def _is_health(line: bytes) -> bool:
    try:
        return protocol.decode_request(line).type == "health"
    except ProtocolError:
        return False


def peer_of(sock: socket.socket, conn: int = 0) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(uid=uid, gid=gid, pid=pid, conn=conn)


def probe_stale(path: Path) -> None:
    """Refuse to steal a socket a live daemon serves. A dead daemon's socket is left in
    place, refusing, until the new one is bound over it: to a client, a socket that
    refuses means a daemon that is coming back (docs/operations.md, "What a restart
    means for clients")."""
    if not path.exists() and not path.is_symlink():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return
    except OSError as exc:
        raise AlreadyRunning(f"cannot probe existing socket {path}: {exc.strerror}") from None
    finally:
        probe.close()
    raise AlreadyRunning(f"another gpusvd is already serving {path}")


def connection_cap(configured: int) -> int:
    """Client connections served at once: as configured, but at most a quarter of the
    descriptor limit, so that clients cannot take what jobs, logs and the database need."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft // 4))


def socket_gid(group: str) -> int | None:
    """The gid that `socket_group` names (None: no group), checked before anything is
    bound: a typo must stop the start, not leave a socket that its users cannot reach."""
    if not group:
        return None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise StartupError(f"socket_group: no such group {group!r}") from None
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise StartupError(
            f"socket_group: {group!r} is not a group of uid {os.geteuid()}, which runs gpusvd"
        )
    return gid


def preflight(path: Path, group: str) -> None:
    """The socket checks, for the very start of gpusvd, before it opens its state: a
    second gpusvd must stop before it reconciles (and kills) the jobs of the one already
    serving, and a bad socket_group before anything is started. Raises StartupError."""
    socket_gid(group)
    probe_stale(path)


async def bind(path: Path, mode: int, group: str) -> anyio.abc.SocketListener:
    """Listen on `path`. The old daemon's socket, refusing until now, is replaced at the
    bind itself: it is there, for clients to wait on, all through the start-up."""
    gid = socket_gid(group)
    path.parent.mkdir(parents=True, exist_ok=True)
    probe_stale(path)
    path.unlink(missing_ok=True)
    old = os.umask(0o177)  # private from the bind on, until chmod opens it to the group
    try:
        listener = await anyio.create_unix_listener(path)
    finally:
        os.umask(old)
    if gid is not None:
        os.chown(path, -1, gid)
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
        max_per_user: int = 64,
        idle_timeout_s: float = 30.0,
        on_close: Callable[[Peer], Awaitable[None]] | None = None,
        kept: Callable[[int], bool] = lambda _conn: False,
        after_big: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = path
        self.handler = handler
        self.mode = mode
        self.group = group
        self.admit = admit
        self.idle_timeout_s = idle_timeout_s
        # `kept`: connections never closed to make room (a `run` client's: closing it
        # would cancel its job).
        self.held = Connections(max_connections, max_per_user, kept)
        self.me = os.getpid()
        self.serial = 0
        # Only a stop removes the socket: after a crash or a restart it stays, refusing,
        # which tells waiting clients that a daemon is coming back.
        self.remove_socket = False
        # Told of every admitted connection's end.
        self.on_close = on_close or _nothing
        # Called once a big request (or answer) is done with: hands the heap it freed back.
        self.after_big = after_big

    def set_limits(self, max_connections: int, max_per_user: int, idle_timeout_s: float) -> None:
        """New connection limits (a reload): connections already open keep theirs."""
        self.held.max_total, self.held.max_per_user = max_connections, max_per_user
        self.idle_timeout_s = idle_timeout_s

    def leave_for_good(self) -> None:
        """A stop: the socket goes with the daemon, since none is coming back."""
        self.remove_socket = True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await bind(self.path, self.mode, self.group)
        log.info("listening", socket=str(self.path), mode=oct(self.mode))
        try:
            async with listener, anyio.create_task_group() as tg:
                task_status.started()
                await self._accept_loop(listener, tg)
        finally:
            if self.remove_socket:
                with contextlib.suppress(OSError):
                    self.path.unlink()

    async def _accept_loop(
        self, listener: anyio.abc.SocketListener, tg: anyio.abc.TaskGroup
    ) -> None:
        while True:
            try:
                conn = await listener.accept()
            except (OSError, anyio.BrokenResourceError) as exc:
                cause = exc if isinstance(exc, OSError) else exc.__cause__  # anyio wraps it
                if not isinstance(cause, OSError) or cause.errno not in _ACCEPT_RETRY:
                    raise
                log.warning("cannot accept a connection now", error=cause.strerror)
                await anyio.sleep(0.1)
                continue
            tg.start_soon(self._connection, conn)

    async def _send(self, conn: anyio.abc.SocketStream, obj: dict[str, Any]) -> bool:
        """False when the client has not taken a part of the answer within the idle
        timeout (or a list sent in pieces failed half-way: the line cannot be ended)."""
        parts = frames(obj)
        while True:
            try:
                frame = next(parts, None)
            except Exception:  # too late for an error answer: the connection is closed
                log.exception("answer failed half-way")
                return False
            if frame is None:
                return True
            with anyio.move_on_after(self.idle_timeout_s):
                await conn.send(frame)
                continue
            return False

    async def _connection(self, conn: anyio.abc.SocketStream) -> None:
        async with conn:
            try:
                self.serial += 1
                peer = peer_of(conn.extra(anyio.abc.SocketAttribute.raw_socket), self.serial)
            except OSError:
                return  # the client is already gone
            # The daemon's own check-in (its ping of its own socket) never waits for room:
            # a flood must not stop WATCHDOG=1.
            busy = None if peer.pid == self.me else self.held.room_for(peer.uid, monotonic())
            if busy is not None:  # answered, and the descriptor given back, at once
                await self._refuse_but_health(conn, peer, busy)
                return
            with anyio.CancelScope() as scope:
                held = Held(peer.conn, peer.uid, scope)
                self.held.add(held)
                try:
                    await self._serve(conn, peer, held)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
                    pass
                except Exception:  # one connection must never take the server down
                    log.exception("connection failed")
                finally:
                    self.held.release(held.serial)
            if scope.cancelled_caught:
                log.info("idle connection closed to make room", peer_uid=peer.uid)

    async def _refuse_but_health(self, conn: anyio.abc.SocketStream, peer: Peer, why: str) -> None:
        """No room: the request is answered `busy`, unless it is a health check, which is
        never refused (a node's health program must not read a full daemon as a dead one)."""
        with anyio.move_on_after(1.0), contextlib.suppress(Exception):
            line = await BufferedByteReceiveStream(conn).receive_until(b"\n", REFUSED_READ)
            if _is_health(line):
                await self._send(conn, await self._answer(line, peer))
                return
        with anyio.move_on_after(1.0), contextlib.suppress(Exception):
            await conn.send(protocol.encode(ProtocolError(protocol.BUSY, why).to_json()))

    async def _refuse(self, conn: anyio.abc.SocketStream, code: str, message: str) -> None:
        """Answer, then take (and drop) the request the client is sending: closing with it
        unread would fail the client's send, and it would never read why it was refused."""
        if not await self._send(conn, ProtocolError(code, message).to_json()):
            return
        with anyio.move_on_after(min(1.0, self.idle_timeout_s)):
            with contextlib.suppress(anyio.DelimiterNotFound, anyio.IncompleteRead):
                await BufferedByteReceiveStream(conn).receive_until(b"\n", REFUSED_READ)

    async def _serve(self, conn: anyio.abc.SocketStream, peer: Peer, held: Held) -> None:
        refused = self.admit(peer)
        if refused is not None:
            await self._refuse(conn, protocol.FORBIDDEN, refused)
            return
        try:
            await self._requests(conn, peer, held)
        finally:
            with anyio.CancelScope(shield=True):  # an evicted connection is told too
                await self.on_close(peer)

    async def _requests(self, conn: anyio.abc.SocketStream, peer: Peer, held: Held) -> None:
        reader = BufferedByteReceiveStream(conn)
        while True:
            try:
                held.idle_since = monotonic()
                with anyio.fail_after(self.idle_timeout_s):
                    line = await reader.receive_until(b"\n", protocol.MAX_LINE + 1)
                held.idle_since = None
            except TimeoutError:
                return
            except (anyio.IncompleteRead, anyio.EndOfStream):
                return
            except anyio.DelimiterNotFound:
                err = ProtocolError(protocol.TOO_LARGE, f"request over {protocol.MAX_LINE} bytes")
                await self._send(conn, err.to_json())
                return
            big = len(line) >= BIG
            answer = await self._answer(line, peer)
            del line  # not held while the answer is sent
            big = big or any(isinstance(v, Pieces) for v in answer.values())
            sent = await self._send(conn, answer)
            del answer
            if big:
                self.after_big()
            if not sent:
                return

    async def _answer(self, line: bytes, peer: Peer) -> dict[str, Any]:
        try:
            request = protocol.decode_request(line)
            return await self.handler(request, peer)
        except ProtocolError as exc:
            return exc.to_json()
        except Exception as exc:  # a bug in one request must not take the daemon down
            log.exception("request failed", peer_uid=peer.uid)
            return ProtocolError(protocol.INTERNAL, f"internal error: {exc!r}").to_json()
