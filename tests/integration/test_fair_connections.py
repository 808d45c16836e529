"""Idle connections are cheap and never lock anyone out: a user at its cap gives up its
longest-idle connection to its own newcomer, and at the daemon's cap the user who holds
the most gives one up. Only when every connection is busy is a newcomer refused, and a
health check never is."""

from __future__ import annotations

import time
from collections.abc import Callable

from supervisor.wire import protocol

from .conftest import Daemon
from .test_security import Raw, Users, users  # noqa: F401  (the users fixture)

CAPS = """
socket_group = "{group}"
[limits]
max_connections = 3
max_connections_per_user = 3
idle_timeout_s = 60
"""


def held(d: Daemon, count: int) -> list[Raw]:
    conns = [_one(d) for _ in range(count)]
    time.sleep(1.2)  # idle long enough to be given up
    return conns


def _one(d: Daemon) -> Raw:
    """A connection that was served. The daemon learns of an earlier client's close (the
    start-up check's) only when it reads it, so until then a newcomer may find the
    connections full, none idle long enough to give way: that one tries again."""
    deadline = time.monotonic() + 20
    while True:
        conn = Raw(d.socket)
        reply = conn.send(b'{"type":"ping"}')
        if reply["ok"]:
            return conn
        conn.close()
        assert reply["code"] == protocol.BUSY and time.monotonic() < deadline, reply
        time.sleep(0.1)


def served_daemon(make_daemon: Callable[..., Daemon], users: Users) -> Daemon:  # noqa: F811
    d = make_daemon(config=CAPS.format(group=users.group), start=False)
    d.socket = users.shared / f"fair-{time.monotonic_ns()}.sock"
    return d.start()


def test_a_user_at_its_cap_gives_up_its_longest_idle_connection_to_its_own_newcomer(
    make_daemon: Callable[..., Daemon],
    users: Users,  # noqa: F811
) -> None:
    d = served_daemon(make_daemon, users)
    oldest, *rest = held(d, 3)
    assert d.call({"type": "list"})["ok"]  # a fourth of root's: room made, not refused
    assert oldest.closed_by_daemon()
    assert all(conn.send(b'{"type":"ping"}')["ok"] for conn in rest)


def test_at_the_daemons_cap_the_biggest_holder_gives_way_to_another_user(
    make_daemon: Callable[..., Daemon],
    users: Users,  # noqa: F811
) -> None:
    d = served_daemon(make_daemon, users)
    conns = held(d, 3)  # root holds every connection, all idle
    listed = users.cli(users.member, d.socket, "list")
    assert listed.returncode == 0, listed.stderr
    assert sum(conn.closed_by_daemon() for conn in conns[:1]) == 1


def test_when_every_connection_is_busy_a_newcomer_is_refused_but_a_health_check_is_answered(
    make_daemon: Callable[..., Daemon],
    users: Users,  # noqa: F811
) -> None:
    d = served_daemon(make_daemon, users)
    job = d.submit("sleep", "60", gpus=0)
    busy = [Raw(d.socket) for _ in range(3)]
    for conn in busy:  # each in a request: none idle
        conn.sock.sendall(b'{"type":"wait","ids":[%d],"timeout_s":6}\n' % job)
    time.sleep(1.2)
    (refused,) = users.call(users.member, d.socket, {"type": "list"})
    assert (refused["ok"], refused["code"]) == (False, protocol.BUSY), refused
    (health,) = users.call(users.member, d.socket, {"type": "health"})
    assert health["ok"] and "health" in health, health
    for conn in busy:
        assert conn.read()["timed_out"] is True
        conn.close()
    d.cli("cancel", str(job))
