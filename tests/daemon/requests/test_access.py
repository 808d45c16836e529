"""Who may do what, with the machine's real users and groups: root and members of
`admin_group` (by primary or supplementary group) act on any job; others on their own."""

from __future__ import annotations

import os

import pytest

from supervisor.core.jobs import Job, JobSpec
from supervisor.daemon.requests.access import Access, forbidden
from supervisor.daemon.requests.server import Peer
from supervisor.wire import protocol

# From /etc/passwd and /etc/group of every Debian-like system: daemon is uid 1 in group
# daemon (gid 1), bin is uid 2 in group bin (gid 2).
DAEMON, BIN, NOBODY_KNOWN = 1, 2, 987_654


def job_of(uid: int) -> Job:
    return Job(1, JobSpec(("true",), "/", {}, uid, uid))


def peer(uid: int) -> Peer:
    return Peer(uid=uid, gid=uid, pid=1)


def test_root_is_always_an_admin() -> None:
    assert Access("").is_admin(0) and Access(None).is_admin(0)


@pytest.mark.parametrize(
    ("group", "uid", "admin"),
    [
        ("", DAEMON, False),
        (None, DAEMON, False),
        ("daemon", DAEMON, True),  # its primary group counts
        ("bin", DAEMON, False),
        ("daemon", BIN, False),
        ("no-such-group", DAEMON, False),
        ("daemon", NOBODY_KNOWN, False),  # a uid without a passwd entry
    ],
)
def test_admin_group_membership(group: str | None, uid: int, admin: bool) -> None:
    assert Access(group).is_admin(uid) is admin


def test_a_reload_changes_the_admin_group() -> None:
    access = Access("bin")
    assert not access.is_admin(DAEMON)
    access.reconfigure("daemon")
    assert access.is_admin(DAEMON)


def test_the_owner_or_an_admin_may_act_on_a_job() -> None:
    access = Access("daemon")
    assert access.may_act(peer(BIN), job_of(BIN))
    assert not access.may_act(peer(BIN), job_of(1000))
    assert access.may_act(peer(DAEMON), job_of(1000))
    assert access.may_act(peer(0), job_of(1000))
    assert access.may_see_uid(peer(BIN), BIN)
    assert not access.may_see_uid(peer(BIN), 1000)
    assert access.may_see_uid(peer(DAEMON), 1000)


@pytest.mark.skipif(os.geteuid() != 0, reason="the rules of a root daemon")
def test_a_root_daemon_serves_and_runs_jobs_for_everyone() -> None:
    access = Access("")
    assert access.admit(peer(BIN)) is None
    access.may_submit(peer(BIN))  # no refusal


def test_forbidden_is_a_protocol_error_of_its_own_code() -> None:
    err = forbidden("cancel job 3")
    assert err.code == protocol.FORBIDDEN and err.message == "not allowed: cancel job 3"
