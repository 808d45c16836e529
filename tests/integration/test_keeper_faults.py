"""A real keeper under faults: a full disk under its log or its journal, stray signals,
a request over the limit. None of them costs a running job or its record."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.keeper.client import Connection, KeeperError
from supervisor.keeper.journal import Journal
from supervisor.wire.framing import MAX_KEEPER_LINE

from .keeper_fixture import PATH, Keeper, alive, keeper, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


@contextlib.contextmanager
def small_tmpfs(size: str = "64k") -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="kdisk-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def fill(where: Path) -> Path:
    """Every free block taken: a write that needs a new one fails ENOSPC."""
    ballast = where / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return ballast


def _sleeper(k: Keeper, job: int, out: Path, seconds: str = "300") -> dict[str, object]:
    return k.job(job, ["sleep", seconds], stdout=str(out), stderr=str(out))


def test_a_full_disk_under_the_keepers_log_costs_nothing(tmp_path: Path) -> None:
    """Every log line fails ENOSPC: bad requests, refused spawns, exits. The keeper lives
    on, and its running job's exit is recorded and reported."""
    with small_tmpfs() as disk, keeper() as k:
        k.kill()  # started again below, its log on the full disk
        (disk / "log").touch()
        (k.home / "log").unlink(missing_ok=True)
        (k.home / "log").symlink_to(disk / "log")
        fill(disk)
        k.start()
        conn = k.connect()
        fifo = tmp_path / "go"
        os.mkfifo(fifo)
        spec = k.job(1, ["sh", "-c", f"read x < {fifo}; exit 5"])
        pid = conn.call("spawn", **spec)["job"]["pid"]
        for _ in range(50):  # each one logged, each log line refused by the disk
            with pytest.raises(KeeperError, match="bad_request"):
                conn.call("spawn", job=2)
        with pytest.raises(KeeperError, match="executable not found"):
            conn.call("spawn", **k.job(3, ["/no/such/thing"]))
        fifo.write_text("go\n")
        event = wait_for(lambda: _exit_event(conn, 1), "job 1's exit")
        assert event["exit_code"] == 5
        assert not alive(pid) and conn.call("ping")["pid"] == k.pid
        assert (disk / "log").stat().st_size == 0  # nothing of it could be logged


def test_a_full_disk_under_a_keeper_with_a_running_job_loses_no_exit(tmp_path: Path) -> None:
    """The exit the journal cannot take is kept in memory and reported, written once the
    disk has room again, and a keeper started after that finds it ended: not `lost`, so
    the job is never run twice."""
    with small_tmpfs("256k") as disk:
        k = Keeper(disk / "keeper", None, None)
        try:
            k.start()
            conn = k.connect()
            fifo = tmp_path / "go"
            os.mkfifo(fifo)
            out = tmp_path / "job.out"
            spec = k.job(1, ["sh", "-c", f"read x < {fifo}; exit 3"], stdout=str(out))
            spec["stderr"] = str(out)
            pid = conn.call("spawn", **spec)["job"]["pid"]
            ballast = fill(disk)
            with contextlib.suppress(KeeperError):  # the journal's last page, then full
                for job in range(100, 200):
                    conn.call("spawn", **_sleeper(k, job, out, "0"))
            fifo.write_text("go\n")
            event = wait_for(lambda: _exit_event(conn, 1), "the exit, reported from memory")
            assert event["exit_code"] == 3 and not event["lost"]
            assert next(r for r in conn.call("list")["jobs"] if r["job"] == 1)["exit_code"] == 3
            assert not alive(pid)
            assert b'"exit_code":3' not in (k.home / "journal").read_bytes()  # not yet
            ballast.unlink()
            wait_for(
                lambda: b'"exit_code":3' in (k.home / "journal").read_bytes(),
                "the exit written once the disk had room",
            )
            k.kill()
            k.start()  # its successor: the record is an exit, not a job it must call lost
            (record,) = [r for r in k.connect().call("list")["jobs"] if r["job"] == 1]
            assert record["exit_code"] == 3 and not record["lost"]
            assert not Journal(k.home / "journal").damaged
        finally:
            k.stop()


def _exit_event(conn: Connection, job: int) -> dict[str, object] | None:
    while conn.events:
        event = conn.events.popleft()
        if event["job"]["job"] == job:
            return dict(event["job"])
    conn.call("ping")  # reads what came meanwhile into conn.events
    return None


def test_stray_signals_cost_the_keeper_nothing_and_reach_no_job() -> None:
    with keeper() as k:
        conn = k.connect()
        pid = conn.call("spawn", **k.job(1, ["sleep", "300"]))["job"]["pid"]
        keeper_pid = k.pid
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            os.kill(keeper_pid, sig)
        assert conn.call("ping")["pid"] == keeper_pid
        assert alive(pid) and [j["job"] for j in conn.call("list")["jobs"]] == [1]
        wait_for(lambda: "SIGTERM ignored" in (k.home / "log").read_text(), "SIGTERM said")
        # The keeper ignores SIGHUP and SIGINT; its jobs do not (an ignored signal would
        # stay ignored across exec).
        status = Path(f"/proc/{pid}/status").read_text()
        ignored = int(next(x for x in status.splitlines() if x.startswith("SigIgn")).split()[1], 16)
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            assert not ignored & (1 << (sig - 1)), sig


def test_a_request_over_the_limit_is_answered_and_costs_the_connection_nothing() -> None:
    """On the attached connection itself: answered `too_large` by its id, the line
    skipped, the next request served, the running job untouched."""
    with keeper() as k:
        conn = k.connect()
        pid = conn.call("spawn", **k.job(1, ["sleep", "300"]))["job"]["pid"]
        big = k.job(2, ["true"], env={**PATH, "BIG": "é" * MAX_KEEPER_LINE})
        with pytest.raises(KeeperError) as refused:
            conn.call("spawn", **big)
        assert refused.value.code == "too_large"
        assert conn.call("ping")["pid"] == k.pid
        assert alive(pid) and [j["job"] for j in conn.call("list")["jobs"]] == [1]
        conn.call("kill", job=1, attempt=1, grace_s=0)
        assert conn.event()["job"]["signal"] == signal.SIGTERM
