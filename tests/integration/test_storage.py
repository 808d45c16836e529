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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
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
    # Its output goes through its keeper, which drops what the full disk refuses: the
    # job itself never sees ENOSPC, so it looks at the disk to know when to end.
    script = (
        "import os, sys\n"
        "while os.statvfs(sys.argv[1]).f_bfree > 0:\n"
        "    sys.stdout.buffer.write(b'y' * 65536); sys.stdout.flush()\n"
        "sys.exit(3)\n"
    )
    job = d.submit("python3", "-c", script, str(small_fs), retries=0, gpus=0)
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
    # Meanwhile the socket answers, and says why nothing is done.
    d.wait_for(lambda: d.socket.exists(), what="the socket while it waits")
    with pytest.raises(Refused) as refused:
        Client(d.socket).call({"type": "list"})
    assert refused.value.code == "storage" and "waiting for space" in str(refused.value)
    cli = d.cli("submit", "--gpus", "0", "--", "true", check=False)
    assert cli.returncode == 1 and "waiting for space" in cli.stderr, cli.stderr
    filler.unlink()
    d.wait_ready(timeout=60)
    assert d.show(job)["state"] == "succeeded"  # the database, untouched
    assert d.wait_done(d.submit("true", gpus=0))["state"] == "succeeded"


def test_a_pause_that_cannot_write_its_marker_is_refused_and_changes_nothing(
    small_fs: Path, daemon_on: Callable[[Path], Daemon]
) -> None:
    d = daemon_on(small_fs)
    filler = fill(small_fs)
    with pytest.raises(Refused) as refused:
        Client(d.socket).call({"type": "pause"})
    assert refused.value.code == "storage" and "disk full" in str(refused.value)
    assert not (d.state / "paused").exists()
    filler.unlink()
    assert d.wait_done(d.submit("true", gpus=0))["state"] == "succeeded"  # not paused
    assert Client(d.socket).call({"type": "pause"})["paused"]
    assert (d.state / "paused").exists()


def test_a_pause_while_the_database_refuses_writes_starts_nothing_lined_up_ahead(
    small_fs: Path, make_daemon: Callable[..., Daemon]
) -> None:
    """The release of a job claimed ahead cannot be recorded while the database refuses
    writes, but its parked spawn is dropped at once: the job in front exits, and nothing
    starts behind it; the release is recorded once writes are taken again."""
    if os.geteuid() != 0:
        pytest.skip("job cgroups need root")
    d = make_daemon(gpus=None, start=False, config="cpu_slots = 1\n[jobs]\nstart_ahead_s = 60\n")
    d.state = small_fs / "state"
    d.start()
    d.wait_done(d.submit("true", mem_key="ahead", gpus=0))  # the kind is short from now on
    gate = "while [ ! -e go ]; do sleep 0.01; done"
    first = d.submit("sh", "-c", gate, mem_key="ahead", gpus=0)
    pid = d.wait_pid(first)
    second = d.submit("sh", "-c", "echo ran >> b", mem_key="ahead", gpus=0)
    d.wait_for(lambda: d.show(second)["starting"], what="the second job claimed ahead")
    spare = small_fs / "spare"
    spare.write_bytes(b"\0" * 65536)  # room for the pause marker, later
    filler = fill(small_fs)
    d.wait_for(lambda: not submit(d, "refused")["ok"], what="a write refused")
    spare.unlink()

    reply = Client(d.socket).call({"type": "pause"})
    assert reply["ok"] and reply["paused"], reply
    (d.root / "go").touch()
    d.wait_for(lambda: not psutil.pid_exists(pid), what="the first job's exit")
    time.sleep(0.3)  # what would start behind it starts at once: it has had its time
    assert not (d.root / "b").exists()

    filler.unlink()
    d.wait_for(lambda: not problems(d), 30, "health ok again once space is back")
    assert d.wait_done(first)["state"] == "succeeded"
    released = d.wait_for(lambda: (j := d.show(second))["state"] == "queued" and j, 30, "requeue")
    assert [a["reason"] for a in released["attempts"]] == ["interrupted"]
    assert not (d.root / "b").exists()
    d.cli("resume")
    assert d.wait_done(second)["state"] == "succeeded"
    assert (d.root / "b").read_text() == "ran\n"
