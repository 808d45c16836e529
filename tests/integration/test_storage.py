"""A full disk, for real: the state dir on a small tmpfs that a test fills up.

Nothing acknowledged is lost, no id is handed out twice, the daemon stays up and says
why it cannot record, and serves again once space is back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.client.connection import Client, Refused

from .conftest import Daemon

pytestmark = pytest.mark.integration


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def daemon_on(make_daemon: Callable[..., Daemon]) -> Callable[[Path], Daemon]:
    def make(fs: Path) -> Daemon:
        d = make_daemon(gpus=None, start=False)
        d.state = fs / "state"  # only the state dir on the small disk: not the daemon's log
        return d.start()

    return make


def fill(fs: Path) -> Path:
    """Write a file until the disk is full; the caller frees the space by deleting it."""
    filler = fs / "filler"
    chunk = b"\0" * (64 * 1024)
    with open(filler, "wb", buffering=0) as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(chunk)
        while True:  # the last few blocks, a page at a time
            try:
                fh.write(chunk[:4096])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return filler


def submit(d: Daemon, marker: str) -> dict[str, Any]:
    """A submit big enough to need new pages in the database (and so the disk)."""
    request = {
        "type": "submit",
        "argv": ["true", marker],
        "gpus": 0,
        "cwd": str(d.root),
        "env": {"PATH": os.environ["PATH"], "PAD": "x" * 100_000},
    }
    try:
        return Client(d.socket).call(request)
    except Refused as exc:
        return {"ok": False, "error": {"code": exc.code, "message": str(exc)}}


def problems(d: Daemon) -> list[str]:
    return list(d.call({"type": "health"})["health"]["problems"])


def test_full_disk_refuses_or_stores_never_loses(
    small_fs: Path, daemon_on: Callable[[Path], Daemon]
) -> None:
    d = daemon_on(small_fs)
    first = d.submit("true", gpus=0)
    d.wait_done(first)
    filler = fill(small_fs)

    acked: dict[int, str] = {}
    refused = []
    for n in range(20):
        reply = submit(d, f"marker-{n}")
        if reply["ok"]:
            acked[reply["ids"][0]] = f"marker-{n}"
        else:
            assert reply["error"]["code"] == "storage", reply
            assert "disk full" in reply["error"]["message"]
            refused.append(n)
    assert refused, "the full disk refused nothing: the test did not fill it"
    assert d.call({"type": "ping"})["ok"]
    assert any("disk full" in p for p in problems(d))
    metrics = d.call({"type": "metrics"})["text"]
    assert "gpusv_storage_writable 0.0" in metrics

    filler.unlink()
    d.wait_for(lambda: not problems(d), 30, "health ok again once space is back")
    reply = submit(d, "after")
    assert reply["ok"], reply
    acked[reply["ids"][0]] = "after"
    ids = sorted(acked)
    assert len(set(ids)) == len(ids) and min(ids) > first

    d.stop()
    d.start()
    for job_id, marker in acked.items():  # every acknowledged job, with what it was given
        assert d.show(job_id)["argv"] == ["true", marker]
    newest = d.submit("true", gpus=0)
    assert newest > max(ids)
    for job_id in [*ids, newest]:
        d.wait_done(job_id, timeout=60)


def test_a_job_filling_the_disk_is_recorded_once_space_is_back(
    small_fs: Path, daemon_on: Callable[[Path], Daemon]
) -> None:
    d = daemon_on(small_fs)
    script = (
        "import sys\n"
        "try:\n"
        "    while True: sys.stdout.buffer.write(b'y' * 65536)\n"
        "except OSError: sys.exit(3)\n"
    )
    job = d.submit("python3", "-c", script, retries=0, gpus=0)
    d.wait_for(lambda: any("disk full" in p for p in problems(d)), 60, "the disk full")
    assert d.show(job)["state"] == "running"  # its end is not recorded: nothing acts on it
    queued = submit(d, "queued")
    assert not queued["ok"] and queued["error"]["code"] == "storage"

    os.truncate(d.state / "logs" / f"{job}.out", 0)  # what an operator does (operations.md)
    done = d.wait_done(job, timeout=60)
    assert done["state"] == "failed" and done["exit_code"] == 3
    attempts = d.show(job)["attempts"]
    assert len(attempts) == 1 and attempts[0]["exit_code"] == 3 and attempts[0]["ended_at"]
    d.wait_for(lambda: not problems(d), 30, "health ok again")

    assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    d.start()
    again = d.show(job)
    assert again["state"] == "failed" and len(again["attempts"]) == 1


def test_a_start_on_a_full_disk_waits_for_space_then_serves(
    small_fs: Path, daemon_on: Callable[[Path], Daemon]
) -> None:
    d = daemon_on(small_fs)
    job = d.submit("true", gpus=0)
    assert d.wait_done(job)["state"] == "succeeded"
    assert d.stop() == 0
    filler = fill(small_fs)
    d.start(wait=False)
    d.wait_for(lambda: "the state filesystem is full" in d.log_text(), what="the wait")
    assert d.proc is not None and d.proc.poll() is None  # waiting, neither exit 2 nor a crash
    assert "disk I/O error" not in d.log_text()
    filler.unlink()
    d.wait_ready(timeout=60)
    assert d.show(job)["state"] == "succeeded"  # the database, untouched
    assert d.wait_done(d.submit("true", gpus=0))["state"] == "succeeded"
