"""A process of a job that clears its environment and leaves its session (`env -i
setsid`) is still the job's: it is found through the job's cgroup, not by anything it can
shed, and it dies with its job, whether the job is cancelled or its leader exits."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from .conftest import Daemon
from .keeper_fixture import alive

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="job cgroups need root"),
]


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


def test_cancel_kills_an_escaped_descendant(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus="1x8G")
    job = d.submit("sh", "-c", _escaping(str(d.root / "b.pid"), "sleep 1000"))
    pid = _escaped_pid(d, "b.pid")
    d.cli("cancel", str(job))
    assert d.wait_done(job)["state"] == "cancelled"
    assert not alive(pid)
