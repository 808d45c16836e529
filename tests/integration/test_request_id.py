"""A submit carries a request id: a repeat returns the first jobs, and the CLI sends a
submit again (same id) when the daemon went away before it answered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "supervisor.client.cli"]


def _submit(d: Daemon, request_id: str, *argvs: list[str]) -> dict[str, Any]:
    request: dict[str, Any] = {
        "cwd": str(d.root),
        "env": {"PATH": os.environ["PATH"]},
        "gpus": 0,
        "request_id": request_id,
    }
    if len(argvs) == 1:
        request.update(type="submit", argv=argvs[0])
    else:
        request.update(type="submit_batch", argvs=list(argvs))
    return d.call(request)


def _all_ids(d: Daemon) -> list[int]:
    return sorted(j["id"] for j in d.call({"type": "list"})["jobs"])


def test_a_repeated_request_id_returns_the_first_jobs(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus=None)
    first = _submit(d, "req-1", ["true", "one"])
    again = _submit(d, "req-1", ["true", "something else"])
    assert again["ids"] == first["ids"] and again["repeated"] is True
    assert again["job"]["argv"] == ["true", "one"]
    batch = _submit(d, "req-2", ["true", "a"], ["true", "b"])
    assert _submit(d, "req-2", ["true", "a"], ["true", "b"])["ids"] == batch["ids"]
    other = _submit(d, "req-3", ["true", "one"])
    assert other["ids"][0] > batch["ids"][-1]
    assert _all_ids(d) == sorted([*first["ids"], *batch["ids"], *other["ids"]])

    d.stop()
    d.start()  # remembered across a restart
    assert _submit(d, "req-1", ["true", "one"])["ids"] == first["ids"]

    cli = [d.cli("submit", "--gpus", "0", "--request-id", "cli-1", "--", "true") for _ in "ab"]
    assert cli[0].stdout == cli[1].stdout and int(cli[0].stdout) > other["ids"][0]


def _pending_connections(sock: Path) -> int:
    """Connections waiting in the listening socket's backlog (its Recv-Q)."""
    out = subprocess.run(
        ["ss", "-xlH", "src", str(sock)], capture_output=True, text=True, timeout=10
    ).stdout.split()
    return int(out[2]) if len(out) > 2 else 0


def test_a_submit_lost_to_a_daemon_restart_is_sent_again_and_made_once(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None)
    assert d.proc is not None
    before = _all_ids(d)
    os.kill(d.proc.pid, signal.SIGSTOP)  # connects, sends, and gets no answer
    client = subprocess.Popen(
        [*CLI, "--socket", str(d.socket), "submit", "--gpus", "0", "--", "true"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=d.env,
        cwd=d.root,
    )
    try:
        d.wait_for(lambda: _pending_connections(d.socket) >= 1, what="the client connected")
        d.kill9()  # the daemon dies with the submit unanswered
        d.start()
        out, err = client.communicate(timeout=90)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 0, err
    job_id = int(out)
    assert _all_ids(d) == [*before, job_id]
    assert d.wait_done(job_id)["state"] == "succeeded"
