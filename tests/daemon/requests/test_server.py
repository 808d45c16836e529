"""The socket server on a real Unix socket, with clients in this process and in child
processes (each its own pid, as SO_PEERCRED reports it): framing, the limits per user
and in all, the idle timeout, a refused peer, and a handler that fails."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.daemon.requests import connections, server
from supervisor.daemon.requests.server import (
    AlreadyRunning,
    Peer,
    Server,
    StartupError,
    bind,
    connection_cap,
    socket_gid,
)
from supervisor.wire import protocol
from supervisor.wire.protocol import Request

PATIENCE_S = 30.0
PING = b'{"type":"ping"}\n'

# A client in a process of its own: `hold` sends a ping, prints the answer and keeps the
# connection until its stdin closes; `knock` sends nothing and prints what it is told.
CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
if sys.argv[2] == "hold":
    s.sendall(b'{"type":"ping"}\\n')
f = s.makefile("rb")
print(f.readline().decode().strip(), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def sock_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="srv", dir="/tmp") as tmp:  # AF_UNIX: short
        yield Path(tmp) / "gpusv.sock"


class Served:
    """A Server on a socket, with the peers its handler saw and those whose end it heard."""

    def __init__(self, path: Path, **kw: Any) -> None:
        self.peers: list[Peer] = []
        self.closed: list[Peer] = []
        self.server = Server(path, self.handle, on_close=self.on_close, **kw)
        self.path = path

    async def handle(self, request: Request, peer: Peer) -> dict[str, Any]:
        self.peers.append(peer)
        if request.type == "stats":
            raise RuntimeError("boom")
        return {"ok": True, "type": request.type}

    async def on_close(self, peer: Peer) -> None:
        self.closed.append(peer)


@contextlib.asynccontextmanager
async def serving(sock_path: Path, **kw: Any) -> AsyncIterator[Served]:
    s = Served(sock_path, **kw)
    async with anyio.create_task_group() as tg:
        await tg.start(s.server.run)
        yield s
        tg.cancel_scope.cancel()


def exchange(path: Path, data: bytes, shut: bool = False) -> list[dict[str, Any]]:
    """Send data (in this process), then read answer lines until the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(PATIENCE_S)
        s.connect(str(path))
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except BrokenPipeError:
            pass
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    return [json.loads(line) for line in raw.splitlines()]


async def in_thread(path: Path, data: bytes, shut: bool = False) -> list[dict[str, Any]]:
    return await anyio.to_thread.run_sync(exchange, path, data, shut)


class Client:
    def __init__(self, path: Path, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(path), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with anyio.fail_after(PATIENCE_S):
            line = await anyio.to_thread.run_sync(self.proc.stdout.readline)
        return dict(json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(PATIENCE_S)


async def wait_until(cond: Any) -> None:
    with anyio.fail_after(PATIENCE_S):
        while not cond():
            await anyio.sleep(0.01)


def error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message}}


async def test_requests_are_answered_in_order_with_the_peer_s_credentials(
    sock_path: Path,
) -> None:
    async with serving(sock_path) as served:
        answers = await in_thread(served.path, PING + b'{"type":"gpus"}\n', shut=True)
        assert answers == [{"ok": True, "type": "ping"}, {"ok": True, "type": "gpus"}]
        me = Peer(os.getuid(), os.getgid(), os.getpid(), 1)
        assert served.peers == [me, me]
        await wait_until(lambda: served.closed == [me])
        client = Client(served.path, "hold")
        try:
            assert await client.answer() == {"ok": True, "type": "ping"}
            assert served.peers[-1] == Peer(os.getuid(), os.getgid(), client.proc.pid, 2)
        finally:
            client.close()


async def test_a_bad_request_is_answered_and_the_connection_goes_on(sock_path: Path) -> None:
    async with serving(sock_path) as served:
        answers = await in_thread(served.path, b'{nope\n{"type":"stats"}\n' + PING, shut=True)
        assert answers[0]["error"]["code"] == protocol.BAD_JSON
        assert answers[1] == error(protocol.INTERNAL, "internal error: RuntimeError('boom')")
        assert answers[2] == {"ok": True, "type": "ping"}


async def test_a_line_over_the_limit_is_refused_and_the_connection_closed(
    sock_path: Path,
) -> None:
    async with serving(sock_path) as served:
        answers = await in_thread(served.path, b"x" * (protocol.MAX_LINE + 1))
        assert answers == [error(protocol.TOO_LARGE, f"request over {protocol.MAX_LINE} bytes")]
        assert served.peers == []
        # A line of exactly the limit, newline included, is read (and is not JSON).
        [answer] = await in_thread(served.path, b"x" * (protocol.MAX_LINE - 1) + b"\n", shut=True)
        assert answer["error"]["code"] == protocol.BAD_JSON


async def test_an_idle_connection_is_closed(sock_path: Path) -> None:
    async with serving(sock_path, idle_timeout_s=0.2) as served:
        assert await in_thread(served.path, b"") == []  # the server closed it
        await wait_until(lambda: len(served.closed) == 1 and not served.server.held.held)


async def test_a_user_over_its_own_cap_hears_busy(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its connections are never idle long enough to be given up (connections.py).
    monkeypatch.setattr(connections, "EVICT_IDLE_S", 3600.0)
    async with serving(sock_path, max_per_user=2, max_connections=10) as served:
        held = [Client(served.path, "hold") for _ in range(2)]
        try:
            for c in held:
                assert (await c.answer())["ok"] is True
            assert served.server.held.by_uid == {os.getuid(): 2}
            knock = Client(served.path, "knock")
            message = (
                f"uid {os.getuid()} holds its limit of 2 connections to gpusvd, "
                "none of them idle; retry"
            )
            assert await knock.answer() == error(protocol.BUSY, message)
            knock.close()
            # The daemon's own check-in (this process is the server's) is never refused.
            assert await in_thread(served.path, PING, shut=True) == [{"ok": True, "type": "ping"}]
        finally:
            for c in held:
                c.close()
        await wait_until(lambda: served.server.held.by_uid == {} and not served.server.held.held)
        again = Client(served.path, "hold")  # the slots came back
        try:
            assert (await again.answer())["ok"] is True
        finally:
            again.close()


async def test_over_the_global_cap_hears_busy(
    sock_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "EVICT_IDLE_S", 3600.0)  # none gives way
    async with serving(sock_path, max_per_user=5, max_connections=1) as served:
        held = Client(served.path, "hold")
        try:
            assert (await held.answer())["ok"] is True
            knock = Client(served.path, "knock")
            message = "gpusvd is serving its limit of 1 connections, none idle; retry"
            assert await knock.answer() == error(protocol.BUSY, message)
            knock.close()
            served.server.set_limits(2, 5, 30.0)  # a reload: the next one fits
            second = Client(served.path, "hold")
            assert (await second.answer())["ok"] is True
            second.close()
        finally:
            held.close()


async def test_a_refused_peer_hears_why_and_its_request_is_not_handled(
    sock_path: Path,
) -> None:
    async with serving(sock_path, admit=lambda _p: "go away") as served:
        assert await in_thread(served.path, PING) == [error(protocol.FORBIDDEN, "go away")]
        assert served.peers == [] and served.closed == []


async def test_bind_sets_the_mode_and_replaces_only_a_dead_socket(sock_path: Path) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock_path))
    dead.close()  # its file stays, nobody listens
    listener = await bind(sock_path, 0o640, "")
    try:
        assert stat.S_IMODE(sock_path.stat().st_mode) == 0o640
        with pytest.raises(AlreadyRunning) as live:
            await bind(sock_path, 0o640, "")
        assert str(live.value) == f"another gpusvd is already serving {sock_path}"
    finally:
        await listener.aclose()


@pytest.mark.skipif(os.geteuid() != 0, reason="chgrp of the socket to another group")
async def test_bind_gives_the_socket_to_its_group(sock_path: Path) -> None:
    listener = await bind(sock_path, 0o660, "daemon")
    try:
        assert sock_path.stat().st_gid == 1  # the group daemon
    finally:
        await listener.aclose()


def test_socket_group_must_exist() -> None:
    assert socket_gid("") is None
    assert socket_gid("daemon") == 1
    with pytest.raises(StartupError) as refused:
        socket_gid("no-such-group")
    assert str(refused.value) == "socket_group: no such group 'no-such-group'"


def test_the_connection_cap_is_at_most_a_quarter_of_the_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
        assert [connection_cap(n) for n in (1, 99, 100, 101, 256)] == [1, 99, 100, 100, 100]
        resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))
        assert connection_cap(256) == 1
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_big_request_is_followed_by_after_big_and_a_small_one_is_not(
    sock_path: Path,
) -> None:
    trims: list[int] = []
    async with serving(sock_path, after_big=lambda: trims.append(1)) as s:
        assert await in_thread(s.path, PING, shut=True) == [{"ok": True, "type": "ping"}]
        assert trims == []
        padded = b'{"type":"ping","x":"' + b"a" * server.BIG + b'"}\n'
        answers = await in_thread(s.path, padded, shut=True)
        assert len(answers) == 1  # an unknown field: refused, and answered all the same
        assert trims == [1]
