"""A state database that cannot be used stops gpusvd with one line and exit 2: never a
hang, a traceback, or an empty start over earlier jobs. Ids never go backwards."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.daemon.store.schema import MIGRATIONS

from .conftest import Daemon

pytestmark = pytest.mark.integration


def _real_db(path: Path, jobs: int = 300) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(MIGRATIONS[1])
    db.execute("PRAGMA user_version=1")
    db.executemany(
        "INSERT INTO jobs (spec, env, owner_uid, mem_key, priority, state, submitted_at) "
        "VALUES (?, '{}', 0, 'k', 0, 'succeeded', '2026-01-01T00:00:00Z')",
        [('{"argv": ["true"], "pad": "' + "x" * 2000 + '"}',) for _ in range(jobs)],
    )
    db.close()


def _garbage(state: Path) -> None:
    (state / "state.db").write_bytes(os.urandom(64 * 1024))


def _truncated(state: Path) -> None:
    _real_db(state / "state.db")
    os.truncate(state / "state.db", (state / "state.db").stat().st_size // 2)


def _newer(state: Path) -> None:
    _real_db(state / "state.db", jobs=1)
    db = sqlite3.connect(state / "state.db")
    db.execute("PRAGMA user_version=99")
    db.close()


def _directory(state: Path) -> None:
    (state / "state.db").mkdir()


def _empty_beside_logs(state: Path) -> None:
    (state / "state.db").touch()
    (state / "logs").mkdir()
    (state / "logs" / "7.out").write_text("an earlier job's output\n")


@pytest.mark.parametrize(
    "damage",
    [_garbage, _truncated, _newer, _directory, _empty_beside_logs],
    ids=["garbage", "truncated", "newer-schema", "directory", "empty-beside-logs"],
)
def test_bad_database_is_one_line_and_exit_2(
    make_daemon: Callable[..., Daemon], damage: Callable[[Path], None]
) -> None:
    d = make_daemon(gpus=None, start=False)
    d.state.mkdir(parents=True)
    damage(d.state)
    # The ceiling is generous: a hang would run into it; a healthy refusal takes ~1 s.
    result = subprocess.run(
        d.argv(), capture_output=True, text=True, timeout=30, env=d.env, cwd=d.root
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpusvd: ")]
    assert len(lines) == 1, result.stderr  # the rest is the log's own lines
    assert "state.db" in lines[0] or "database" in lines[0]
    assert not d.socket.exists()


def test_ids_go_on_after_a_lost_tail(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus=None)
    first = d.submit("true", gpus=0)
    d.wait_done(first)
    d.stop()
    saved = d.root / "saved.db"
    shutil.copy(d.state / "state.db", saved)  # a clean stop leaves no WAL to copy

    d.start()
    later = [d.submit("true", gpus=0) for _ in range(3)]
    for job_id in later:
        d.wait_done(job_id)
    d.stop()

    def restore() -> None:
        for suffix in ("-wal", "-shm"):
            (d.state / f"state.db{suffix}").unlink(missing_ok=True)
        shutil.copy(saved, d.state / "state.db")

    restore()  # the database lost its tail; the id mark did not
    d.start()
    after_mark = d.submit("true", gpus=0)
    assert after_mark > max(later)
    d.wait_done(after_mark)
    d.stop()

    restore()
    (d.state / "state.db.ids").unlink()  # both lost: the jobs' logs still tell
    d.start()
    assert d.submit("true", gpus=0) > after_mark
    assert "ids continue after them" in d.log_text()


def test_the_daemon_module_runs_as_a_script() -> None:
    """The tests start gpusvd as `python -m`: keep that entry point."""
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.daemon.life.app", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "gpusvd" in result.stdout
