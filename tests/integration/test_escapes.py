"""A process of a job that clears its environment and leaves its session (`env -i
setsid`) is still the job's: it is found through the job's cgroup, not by anything it can
shed, and it dies with its job, whether the job is cancelled or its leader exits.

Without a cgroup (a user's own gpusvd) a descendant that double-forks into a session of
its own is found by the tag it keeps, once its keeper is its parent: that runs both ways.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil
import pytest

from .conftest import Daemon
from .keeper_fixture import alive

pytestmark = pytest.mark.integration
CGROUP_ONLY = "an escapee that cleared its environment is found only by its job's cgroup"


def _escaping(pidfile: str, then: str) -> str:
    """A shell that starts a descendant with an empty environment in a session of its
    own, waits until it has written its pid, then runs `then`."""
    inner = f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 1000"
    return (
        f"env -i /usr/bin/setsid -f /bin/sh -c '{inner}'; "
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done; {then}"
    )


def _escaped_pid(d: Daemon, name: str) -> int:
    pidfile = d.root / name
    d.wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the escapee")
    pid = int(pidfile.read_text())
    with open(f"/proc/{pid}/environ", "rb") as fh:
        assert b"GPUSV_JOB_ID" not in fh.read()  # nothing left to match it by
    assert os.getsid(pid) == pid
    return pid


@pytest.mark.root(CGROUP_ONLY)
def test_an_escaped_descendant_dies_before_its_finished_job_frees_the_card(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G")
    go = d.root / "go"
    job = d.submit(
        "sh", "-c", _escaping(str(d.root / "a.pid"), f"until [ -e {go} ]; do sleep 0.01; done")
    )
    pid = _escaped_pid(d, "a.pid")
    go.touch()  # the leader exits 0; its escaped descendant is still running
    done = d.wait_done(job)
    assert done["state"] == "succeeded"
    assert not alive(pid)  # killed before the end was reported, so before the card was free
    following = d.submit("true")
    assert d.wait_done(following)["state"] == "succeeded"


@pytest.mark.root(CGROUP_ONLY)
def test_cancel_kills_an_escaped_descendant(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus="1x8G")
    job = d.submit("sh", "-c", _escaping(str(d.root / "b.pid"), "sleep 1000"))
    pid = _escaped_pid(d, "b.pid")
    d.cli("cancel", str(job))
    assert d.wait_done(job)["state"] == "cancelled"
    assert not alive(pid)


def _double_fork(d: Daemon, name: str, then: str) -> str:
    """A subshell starts a new session's shell with a child of its own and exits at
    once: that shell is re-parented to the keeper, out of the leader's tree and session,
    with the environment it was given. Then the leader runs `then`."""
    pidfile = d.root / name
    inner = f"sleep 1000 & echo $$ $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; wait"
    return f"(setsid sh -c '{inner}' &); while [ ! -s {pidfile} ]; do sleep 0.01; done; {then}"


def _escapees(d: Daemon, name: str) -> list[int]:
    pidfile = d.root / name
    d.wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the escapees")
    return [int(p) for p in pidfile.read_text().split()]


def test_cancel_kills_a_double_forked_descendant_in_a_session_of_its_own(
    make_any_daemon: Callable[..., Daemon],
) -> None:
    d = make_any_daemon(gpus="1x8G")
    job = d.submit("sh", "-c", _double_fork(d, "c.pid", "sleep 1000"))
    leader = d.wait_pid(job)
    escapees = _escapees(d, "c.pid")
    assert all(alive(p) for p in escapees)
    assert os.getsid(escapees[0]) == escapees[0] != os.getsid(leader)  # a session of its own
    assert escapees[0] not in [c.pid for c in psutil.Process(leader).children(recursive=True)]
    d.cli("cancel", str(job))
    assert d.wait_done(job)["state"] == "cancelled"
    survivors = [p for p in (leader, *escapees) if alive(p)]
    assert not survivors, f"still running after the cancel: {survivors}"


def test_a_double_forked_descendant_dies_before_its_finished_job_frees_the_card(
    make_any_daemon: Callable[..., Daemon],
) -> None:
    d = make_any_daemon(gpus="1x8G")
    job = d.submit("sh", "-c", _double_fork(d, "e.pid", "exit 0"))
    done = d.wait_done(job)
    assert done["state"] == "succeeded"
    escapees = _escapees(d, "e.pid")
    survivors = [p for p in escapees if alive(p)]
    assert not survivors, f"left running after the job's end: {survivors}"
