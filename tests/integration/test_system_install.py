"""The layout the systemd unit makes, for real: /etc/gpusvd.toml with a socket_group, a
gpusvd started with no flags (so on /run/gpusvd/gpusvd.sock), a member of the group
using gpusv with no GPUSV_SOCKET, and an outsider refused.

This touches the real /etc/gpusvd.toml and /run/gpusvd: an existing file is put back
afterwards, and a lock keeps two runs of this test (parallel suites) apart."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client.cli import Client, Unreachable
from supervisor.daemon.running.keeper_processes import abandon
from supervisor.wire.locations import SYSTEM_CONFIG, SYSTEM_SOCKET

from .test_security import Users, users  # noqa: F401  (the fixture that makes real users)

LOCK = Path("/run/lock/gpusv-system-install-test.lock")


@contextlib.contextmanager
def system_paths() -> Iterator[None]:
    """Hold the lock; put /etc/gpusvd.toml and /run/gpusvd back as they were."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = SYSTEM_CONFIG.read_bytes() if SYSTEM_CONFIG.exists() else None
        made_run = not SYSTEM_SOCKET.parent.exists()
        try:
            yield
        finally:
            if saved is None:
                SYSTEM_CONFIG.unlink(missing_ok=True)
            else:
                SYSTEM_CONFIG.write_bytes(saved)
            if made_run:
                shutil.rmtree(SYSTEM_SOCKET.parent, ignore_errors=True)


def answers(path: Path) -> bool:
    try:
        Client(path).call({"type": "ping"})
        return True
    except (Unreachable, OSError):
        return False


def test_the_unit_layout_works_without_flags(users: Users, tmp_path: Path) -> None:  # noqa: F811
    with system_paths():
        if answers(SYSTEM_SOCKET):
            pytest.skip(f"a gpusvd already serves {SYSTEM_SOCKET}")
        state = tmp_path / "state"
        SYSTEM_CONFIG.write_text(
            f'socket_group = "{users.group}"\nstate_dir = "{state}"\n'
            'simulate_gpus = "1x8G"\nkernel_log = "off"\ncpu_slots = 2\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSV", "XDG_"))}
        env["GPUSV_TEST_ROOT"] = str(users.shared)
        log = tmp_path / "gpusvd.log"
        with open(log, "wb") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "supervisor.daemon.life.app"],
                stdout=out,
                stderr=out,
                env=env,
            )
        try:
            deadline = time.monotonic() + 30
            while not answers(SYSTEM_SOCKET):
                assert daemon.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            assert SYSTEM_SOCKET.stat().st_gid == users.gid
            member = users.member
            gpusv = [users.python, "-m", "supervisor.client.cli"]
            done = users.run(member, *gpusv, "submit", "--gpus", "0", "--wait", "--", "id", "-u")
            assert done.returncode == 0, done.stderr
            job = done.stdout.split()[0]
            assert users.run(member, *gpusv, "logs", job).stdout == f"{member.uid}\n"
            mine = users.run(member, *gpusv, "list", "--mine")
            assert mine.returncode == 0 and member.name in mine.stdout
            refused = users.run(users.outsider, *gpusv, "list")
            assert refused.returncode == 3
            assert f"{SYSTEM_SOCKET} (permission denied)" in refused.stderr
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            abandon(state)
