"""Start-up on a full state filesystem, for real: a small tmpfs the probe does not fit
in; the daemon says so to systemd, waits, and goes on once the filesystem has room."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor.daemon.life import space
from supervisor.daemon.life.systemd import Notifier


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: too small for the 256 KiB probe. Unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "state"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def notify(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    with tempfile.TemporaryDirectory(prefix="sd", dir="/tmp") as tmp:
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        try:
            yield sock
        finally:
            sock.close()


def test_a_probe_that_fits_leaves_nothing_behind(tmp_path: Path) -> None:
    assert space.room_to_start(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_a_full_filesystem_is_an_error_returned_not_raised(small_fs: Path) -> None:
    exc = space.room_to_start(small_fs)
    assert exc is not None and exc.errno == 28  # ENOSPC
    assert list(small_fs.iterdir()) == []  # the partial probe is gone


def test_any_other_failure_is_raised(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        space.room_to_start(tmp_path / "missing")


async def test_start_up_waits_for_space_and_says_so(
    small_fs: Path, notify: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(space, "RETRY_S", 0.05)
    notify.setblocking(False)
    done = anyio.Event()

    async def start() -> None:
        await space.wait_for_space(small_fs, Notifier())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        received: list[bytes] = []
        with anyio.fail_after(30):
            while len(received) < 3:  # status, extension, and a second extension
                await anyio.wait_readable(notify)
                received.append(notify.recv(4096))
        assert not done.is_set()
        assert received == [
            b"STATUS=the state filesystem is full (No space left on device; 64 KiB free in "
            + os.fsencode(small_fs)
            + b"): waiting for space before opening the database",
            b"EXTEND_TIMEOUT_USEC=250000",
            b"EXTEND_TIMEOUT_USEC=250000",  # the status is sent once, the extension each try
        ]
        subprocess.run(["mount", "-o", "remount,size=1m", str(small_fs)], check=True)
        with anyio.fail_after(30):
            await done.wait()
