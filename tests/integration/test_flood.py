"""Descriptors and connection floods, for real: a daemon under a 1,024 descriptor limit,
1,400 connections at once, one user's idle flood against another user and the watchdog."""

from __future__ import annotations

import contextlib
import json
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
import socket, sys, time
path, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held, opened, end = [], 0, time.monotonic() + seconds
while time.monotonic() < end:
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
    for s in held:  # closed by the daemon (busy, idle): open another in its place
        try:
            if s.recv(4096) == b"":
                s.close()
        except BlockingIOError:
            pass
        except OSError:
            s.close()
    time.sleep(0.02)
print(opened)
"""


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
    seconds = 8.0
    flood = subprocess.Popen(
        users.argv(users.member, users.python, "-c", FLOOD, str(d.socket), "300", str(seconds)),
        env=users.env(users.member),
        cwd=users.shared,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = time.monotonic()
        time.sleep(1.0)  # the flood has taken what it can
        served = 0
        while time.monotonic() - started < seconds - 1.0:
            assert d.call({"type": "list"})["ok"]  # another user: never `busy`
            served += 1
            time.sleep(0.1)
        # The daemon's own check-in went on during the flood (it pings every second).
        assert _heartbeat_age(d, "server") < seconds - 1.0
        out, _ = flood.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            flood.kill()
        flood.wait()
    assert int(out.strip()) > 300, "the flood did not reopen what was closed"
    assert served >= 3  # a count, not a rate: under load each call may take a while
    notify.drain(0.2)
    during = [at for at, m in notify.messages if m == "WATCHDOG=1" and at > started]
    assert during, "no WATCHDOG=1 during the flood"
    assert "watchdog pings withheld" not in d.log_text()
    health = d.call({"type": "health"})["health"]
    assert health["ok"], json.dumps(health)
