"""Descriptors and connection floods, for real: a daemon under a 1,024 descriptor limit,
1,400 connections at once, one user's idle flood against another user and the watchdog."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Daemon
from .test_deadman_systemd import NotifySocket
from .test_security import Users, group_daemon, users

pytestmark = pytest.mark.integration
__all__ = ["users"]  # the fixture, shared with the security tests


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.sock.close()


def _connect_many(path: Path, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(path))
        socks.append(s)
    return socks


def test_1400_connections_under_1024_descriptors(
    make_daemon: Callable[..., Daemon], users: Users
) -> None:
    d = group_daemon(make_daemon, users)
    assert d.proc is not None
    resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (1024, 1024))
    job = d.submit("sleep", "120", gpus=0)  # the sampler lists /proc all along
    d.wait_state(job, "running")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    socks = _connect_many(d.socket, 1400)
    try:
        listed = users.cli(users.member, d.socket, "list")
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"^\s*{job}\s", listed.stdout, re.M), listed.stdout
    finally:
        for s in socks:
            s.close()
    assert d.proc.poll() is None, d.log_text()[-3000:]
    assert d.call({"type": "ping"})["ok"]
    assert d.show(job)["state"] == "running"


FLOOD = """
import os, socket, sys, time
path, n, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
held, opened, end, ready = [], 0, time.monotonic() + 120, False
reopened = False
while time.monotonic() < end and not os.path.exists(stop):
    held = [s for s in held if s.fileno() >= 0]
    while len(held) < n:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        try:
            s.connect(path)
        except OSError:
            s.close()
            break
        s.setblocking(False)
        held.append(s)
        opened += 1
        if opened > n and not reopened:
            print("reopened", flush=True)
            reopened = True
    if not ready:
        print("ready", flush=True)
        ready = True
    for s in held:  # closed by the daemon (busy, idle): open another in its place
        try:
            if s.recv(4096) == b"":
                s.close()
        except BlockingIOError:
            pass
        except OSError:
            s.close()
    time.sleep(0.02)
print(opened, flush=True)
"""


def _watchdog_since(notify: NotifySocket, began: float) -> bool:
    notify.drain(0.1)
    return any(m == "WATCHDOG=1" and at > began for at, m in notify.messages)


def _heartbeat_age(d: Daemon, service: str) -> float:
    text = d.call({"type": "metrics"})["text"]
    m = re.search(rf'^gpusv_heartbeat_age_seconds{{service="{service}"}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_one_users_idle_flood_neither_refuses_another_nor_stops_the_watchdog(
    make_daemon: Callable[..., Daemon], users: Users, notify: NotifySocket, tmp_path: Path
) -> None:
    # WATCHDOG=1 every 1 s; the server's own check-in as often.
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "2000000"}
    d = make_daemon(
        config=f'socket_group = "{users.group}"\n[limits]\nmax_connections = 64\n'
        "max_connections_per_user = 16\n",
        env=env,
        start=False,
    )
    d.socket = users.shared / "flood.sock"
    d.start()
    notify.wait_for("READY=1")
    stop = users.shared / f"stop-flood-{os.getpid()}"  # where the flooding user can see it
    flood = subprocess.Popen(
        users.argv(users.member, users.python, "-c", FLOOD, str(d.socket), "300", str(stop)),
        env=users.env(users.member),
        cwd=users.shared,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
        began = time.monotonic()
        for _ in range(5):  # another user, during the flood: never `busy`
            assert d.call({"type": "list"})["ok"]
        # The daemon's own check-in goes on during the flood: the server beats again.
        d.wait_for(
            lambda: _heartbeat_age(d, "server") < time.monotonic() - began,
            what="the server's check-in during the flood",
        )
        d.wait_for(
            lambda: (
                any(m == "WATCHDOG=1" and at > began for at, m in notify.messages)
                or (notify.drain(0.1) and False)
            ),
            what="WATCHDOG=1 during the flood",
        )
        assert flood.poll() is None  # all of it happened while the flood went on
        # The flood pressed the limit: the daemon closed some of its connections.
        assert flood.stdout.readline().strip() == "reopened"
        stop.touch()
        out, _ = flood.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            flood.kill()
        flood.wait()
        stop.unlink(missing_ok=True)
    assert int(out.strip()) > 300, "the flood did not reopen what was closed"
    assert "watchdog pings withheld" not in d.log_text()
    health = d.call({"type": "health"})["health"]
    assert health["ok"], json.dumps(health)
