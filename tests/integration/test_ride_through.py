"""Clients ride through a daemon restart: `run`, `wait`, `submit --wait` and `logs --follow`
stay attached to their job across a kill -9 (or a SIGQUIT leave) and a new gpusvd on the
same state and socket, print every line once and end with the job's own status; a submit
sent while the daemon is down makes one job; no daemon, or one that stays away, is exit 3;
`health --timeout` answers even when the daemon cannot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Daemon

LINES = 40
COUNTED = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.1; done; exit 5"
EXPECTED = [f"line {i}" for i in range(1, LINES + 1)]
GPUSV = [sys.executable, "-m", "supervisor.client.cli"]
DOWN_S = 1.5  # how long the daemon stays away: a restart's gap, well inside the bound


class Attached:
    """A `gpusv` subprocess whose stdout and stderr go to files, read while it runs."""

    def __init__(self, d: Daemon, name: str, *args: str) -> None:
        self.out = d.root / f"{name}.out"
        self.err = d.root / f"{name}.err"
        argv = [*GPUSV, "--socket", str(d.socket), *args]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=d.env, cwd=d.root)

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"gpusv still attached: {self.err.read_text()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def restart(d: Daemon, sig: int = signal.SIGKILL) -> None:
    """The daemon gone (a crash, or a SIGQUIT leave), then a new one on the same state
    and socket after a restart's gap."""
    assert d.proc is not None
    d.proc.send_signal(sig)
    d.proc.wait(30)
    assert d.socket.exists()  # left refusing: what tells clients a daemon is coming back
    time.sleep(DOWN_S)
    d.start()


def _gpusv(
    d: Daemon, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUSV, "--socket", str(d.socket), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**d.env, **(env or {})},
        cwd=d.root,
    )


def _attempts(d: Daemon, job_id: int) -> int:
    return len(d.show(job_id)["attempts"])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGQUIT], ids=["kill9", "leave"])
def test_run_prints_every_line_once_through_a_restart(daemon: Daemon, sig: int) -> None:
    d = daemon
    run = Attached(d, "run", "run", "--gpus", "0", "--retries", "0", "--", "sh", "-c", COUNTED)
    try:
        d.wait_for(lambda: len(run.lines()) >= 5, what="the run's first lines")
        restart(d, sig)
        assert run.wait() == 5, run.err.read_text()
    finally:
        run.stop()
    assert run.lines() == EXPECTED
    job = json.loads(d.cli("list", "--json").stdout)[0]
    assert _attempts(d, job["id"]) == 1  # taken back, not run again


def test_wait_submit_wait_and_follow_ride_through_a_restart(daemon: Daemon) -> None:
    d = daemon
    opts = ("--gpus", "0", "--retries", "0")
    submitted = Attached(d, "submit", "submit", *opts, "--wait", "--", "sh", "-c", COUNTED)
    clients = [submitted]
    try:
        job_id = int(d.wait_for(lambda: submitted.lines()[:1], what="the job's id")[0])
        waiting = Attached(d, "wait", "wait", str(job_id))
        follow = Attached(d, "follow", "logs", str(job_id), "--follow")
        clients += [waiting, follow]
        d.wait_for(lambda: len(follow.lines()) >= 5, what="the followed lines")
        restart(d)
        assert submitted.wait() == 5, submitted.err.read_text()
        assert waiting.wait() == 5, waiting.err.read_text()
        assert follow.wait() == 0, follow.err.read_text()
    finally:
        for client in clients:
            client.stop()
    assert follow.lines() == EXPECTED
    assert waiting.lines() == [f"{job_id} failed (exit_nonzero) exit 5"]
    assert _attempts(d, job_id) == 1


def test_a_submit_sent_while_the_daemon_is_down_makes_one_job(daemon: Daemon) -> None:
    d = daemon
    assert d.proc is not None
    d.kill9()
    submit = Attached(d, "submit", "submit", "--gpus", "0", "--name", "once", "--", "true")
    try:
        time.sleep(DOWN_S)
        d.start()
        assert submit.wait() == 0, submit.err.read_text()
    finally:
        submit.stop()
    jobs = [j for j in json.loads(d.cli("list", "--json").stdout) if j["name"] == "once"]
    assert [j["id"] for j in jobs] == [int(submit.lines()[0])]


def test_a_run_is_tied_again_to_its_client_after_a_restart(daemon: Daemon) -> None:
    """The new daemon cancels the job when its reattached client goes away."""
    d = daemon
    endless = "i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done"
    run = Attached(d, "run", "run", "--gpus", "0", "--name", "tied", "--", "sh", "-c", endless)
    try:
        d.wait_for(lambda: len(run.lines()) >= 3, what="the run's first lines")
        job_id = json.loads(d.cli("list", "--json").stdout)[0]["id"]
        restart(d)
        printed = len(run.lines())
        d.wait_for(lambda: len(run.lines()) > printed + 3, what="lines through the new daemon")
        run.proc.kill()
        run.proc.wait()
        assert d.wait_done(job_id)["state"] == "cancelled"
    finally:
        run.stop()


def test_no_daemon_ever_started_is_exit_3_at_once(tmp_path: Path) -> None:
    # The subprocess's ceiling is half the bound: waiting for a daemon would run into it.
    socket = str(tmp_path / "none.sock")
    result = subprocess.run(
        [
            *GPUSV,
            "--socket",
            socket,
            "--connect-timeout",
            "120",
            "run",
            "--gpus",
            "0",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3
    assert "gpusvd is not running" in result.stderr and "no such socket" in result.stderr


def test_a_stopped_daemon_is_exit_3_at_once(daemon: Daemon) -> None:
    daemon.stop()  # a drain: the daemon removes its socket, nothing is coming back
    assert not daemon.socket.exists()
    result = _gpusv(daemon, "--connect-timeout", "120", "list", timeout=60)
    assert result.returncode == 3 and "not running" in result.stderr


def test_a_run_whose_daemon_is_stopped_is_exit_3_at_once(daemon: Daemon) -> None:
    """A stop is not a restart: the daemon drains and removes its socket."""
    d = daemon
    run = Attached(d, "run", "--connect-timeout", "300", "run", "--gpus", "0", "--", "sleep", "300")
    try:
        d.wait_for(lambda: json.loads(d.cli("list", "--json").stdout), what="the run's job")
        d.stop()
        assert run.wait(timeout=120) == 3  # the ceiling is under the bound: no wait for it
        assert "not running" in run.err.read_text()
    finally:
        run.stop()


def test_a_daemon_that_stays_away_is_exit_3_past_the_bound(daemon: Daemon) -> None:
    d = daemon
    run = Attached(d, "run", "--connect-timeout", "2", "run", "--gpus", "0", "--", "sleep", "300")
    try:
        d.wait_for(lambda: json.loads(d.cli("list", "--json").stdout), what="the run's job")
        d.kill9()
        assert run.wait() == 3
        assert "did not come back within 2 s" in run.err.read_text()
    finally:
        run.stop()
    listed = _gpusv(d, "list", timeout=60, env={"GPUSV_CONNECT_TIMEOUT": "1"})
    assert listed.returncode == 3 and "did not come back within 1 s" in listed.stderr


def test_health_answers_within_its_timeout_when_the_daemon_cannot(daemon: Daemon) -> None:
    d = daemon
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        result = _gpusv(d, "health", "--timeout", "1", timeout=30)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert result.returncode == 3
    assert result.stderr.strip() == "gpusv: gpusvd did not answer within 1 s"
    assert _gpusv(d, "health").returncode == 0
    d.kill9()  # restarting, and not back within health's own bound
    result = _gpusv(d, "health", "--timeout", "1", timeout=30)
    assert result.returncode == 3 and "within 1 s" in result.stderr
