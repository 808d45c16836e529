"""A job whose working directory or program lies on a file system that does not answer
(a hung NFS server, made here for real: tests/hung_fs.py) holds only itself: its keeper
goes on serving its card, and gpusvd lists it, cancels it, and records why it never ran
once the file system fails it."""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper.client import Connection
from supervisor.keeper.local_fs import LocalPaths
from supervisor.keeper.spawn import Spec
from tests import hung_fs

from .conftest import Daemon
from .keeper_fixture import alive, keeper

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups and a FUSE mount need root here"),
]


def test_a_mount_made_since_an_answer_is_seen_at_once() -> None:
    why = hung_fs.why_not()
    if why is not None:
        pytest.skip(why)
    where = Path(tempfile.mkdtemp(prefix="hung-", dir="/tmp"))
    spec = Spec(1, 1, ("true",), str(where), {"PATH": "/usr/bin:/bin"}, "/dev/null", "/dev/null")
    paths = LocalPaths()
    try:
        assert paths.start(spec) is None
        with hung_fs.hung_mount(where):
            assert paths.start(spec) == f"{where} (fuse.gpusv-test-hung)"
        assert paths.start(spec) is None  # unmounted: near again
    finally:
        paths.close()
        where.rmdir()


def _exit_of(conn: Connection, job: int) -> dict[str, Any]:
    while True:
        message = conn.event()
        if message.get("event") == "exit" and message["job"]["job"] == job:
            found: dict[str, Any] = message["job"]
            return found


@pytest.mark.parametrize("where", ["cwd", "program", "PATH"])
def test_the_keeper_serves_on_beside_a_job_that_waits_on_its_file_system(
    hung: hung_fs.Hung, where: str
) -> None:
    far = str(hung.path / "work")
    specs: dict[str, dict[str, Any]] = {
        "cwd": {"cwd": far},
        "program": {"argv": [f"{far}/bin/tool"]},
        "PATH": {"env": {"PATH": f"{far}/bin:/usr/bin:/bin"}},
    }
    spec = specs[where]
    with keeper() as k:
        conn = k.connect()
        aside = k.connect(attach=False)  # its answer comes once it is known to wait
        waiting = aside.send("spawn", **{**k.job(1, spec.pop("argv", ["true"])), **spec})
        conn.call("spawn", **k.job(2, ["sh", "-c", "echo ran"]))
        assert _exit_of(conn, 2)["exit_code"] == 0
        assert k.output(2) == "ran\n"
        started = aside.reply(waiting)  # within EXEC_ANSWER_S, as started: its pid known
        assert started["ok"] and alive(started["job"]["pid"])
        assert "start by fork" in (k.home / "log").read_text()
        conn.call("kill", job=1, attempt=1, grace_s=0.2)
        assert _exit_of(conn, 1)["signal"] in (signal.SIGTERM, signal.SIGKILL)


def _waiting(d: Daemon, hung: hung_fs.Hung) -> int:
    """A job whose working directory does not answer, answered as started (its pid)."""
    waiting = d.submit("true", cwd=str(hung.path / "work"))
    d.wait_pid(waiting)
    return waiting


def test_through_gpusvd_the_waiting_job_runs_on_its_card_and_is_cancelled(
    make_daemon: Callable[..., Daemon], hung: hung_fs.Hung
) -> None:
    d = make_daemon(gpus="2x8G")
    waiting = _waiting(d, hung)
    assert d.show(waiting)["state"] == "running"
    assert d.wait_done(d.submit("true"))["state"] == "succeeded"
    assert d.cli("health").returncode == 0
    assert d.cli("cancel", str(waiting)).stdout == f"{waiting} cancelling\n"
    job = d.wait_done(waiting)
    assert (job["state"], job["reason"]) == ("cancelled", "cancelled")
    assert "keeper stuck" not in d.log_text()


def test_a_job_the_file_system_fails_at_last_is_recorded_as_never_run(
    make_daemon: Callable[..., Daemon], hung: hung_fs.Hung
) -> None:
    d = make_daemon(gpus="1x8G")
    waiting = _waiting(d, hung)
    hung.release()  # the server is gone for good: the chdir fails (ENOTCONN)
    job = d.wait_done(waiting)
    assert (job["state"], job["reason"]) == ("failed", "spawn_failed")
    message = job["attempts"][-1]["evidence"]["message"]
    assert message.startswith(f"cannot enter working directory {hung.path}/work")
    assert "not connected" in d.cli("logs", str(waiting)).stdout


def test_a_waiting_job_is_stopped_at_its_time_limit(
    make_daemon: Callable[..., Daemon], hung: hung_fs.Hung
) -> None:
    d = make_daemon(gpus="1x8G")
    waiting = d.submit("true", cwd=str(hung.path / "work"), time_limit_s=2, retries=0)
    job = d.wait_done(waiting)
    assert (job["state"], job["reason"]) == ("failed", "timeout")
    assert d.wait_done(d.submit("true"))["state"] == "succeeded"  # its card serves on
