"""What the daemon still does to processes itself, on real processes and the machine's
real users: kill what an attempt older than keepers left (only the same process, by
pid and start time, with its whole group), and who a job runs as."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.daemon.running.launch import SpawnError, kill_leftover, user_of

PATIENCE_S = 30.0


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A leader in a session of its own with a grandchild in its group: (leader, grandchild)."""
    pidfile = tmp_path / "pid"
    leader = subprocess.Popen(
        [
            "sh",
            "-c",
            f'sleep 300 & echo $! > "{pidfile}.tmp"; mv "{pidfile}.tmp" "{pidfile}"; wait',
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + PATIENCE_S
    while not pidfile.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child = int(pidfile.read_text())
    try:
        yield leader, child
    finally:
        if leader.poll() is None:  # not reaped: its group id is still its own
            os.killpg(leader.pid, 9)
        leader.wait()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_same_process_is_killed_with_its_group(
    group: tuple[subprocess.Popen[bytes], int],
) -> None:
    leader, child = group
    start = psutil.Process(leader.pid).create_time()
    assert kill_leftover(leader.pid, start) is True
    assert leader.wait(PATIENCE_S) == -9
    deadline = time.monotonic() + PATIENCE_S
    while not gone(child):
        assert time.monotonic() < deadline, "the grandchild outlived its leader"
        time.sleep(0.01)


def test_a_pid_of_another_start_is_left_alone(
    group: tuple[subprocess.Popen[bytes], int],
) -> None:
    leader, child = group
    start = psutil.Process(leader.pid).create_time()
    assert kill_leftover(leader.pid, start - 2.0) is False
    assert kill_leftover(leader.pid, start + 2.0) is False
    assert leader.poll() is None and not gone(child)
    # Within a second of the recorded start it is the same process (stamps are rounded).
    assert kill_leftover(leader.pid, start + 0.9) is True


def test_a_pid_no_longer_there_is_nothing_to_kill() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert kill_leftover(done.pid, None) is False


@pytest.mark.skipif(os.geteuid() != 0, reason="a root daemon runs jobs as their submitters")
def test_a_job_runs_as_its_submitter() -> None:
    # daemon: uid 1, group 1, home /usr/sbin, on Debian-like systems.
    assert user_of(1) == (
        {"HOME": "/usr/sbin", "USER": "daemon", "LOGNAME": "daemon"},
        1,
        1,
        tuple(os.getgrouplist("daemon", 1)),
    )
    assert user_of(0) == ({}, None, None, None)  # as the daemon itself: nothing to change
    with pytest.raises(SpawnError) as unknown:
        user_of(987_654)
    assert str(unknown.value) == "uid 987654 has no passwd entry: cannot set up its groups"
