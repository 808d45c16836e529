"""The deadman and systemd integration against a real daemon."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Daemon
from .test_gpu_hangs import XID_109_CARD0


def test_a_wedged_abort_exits_70_with_forensics_and_only_the_wedged_job_loses_its_attempt(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(env={"GPUSVD_ABORT_DEADLINE_S": "2"}, config="cpu_slots = 1\n")
    marker = d.root / "started"
    script = f'if [ "$GPUSV_ATTEMPT" = 1 ]; then echo x > {marker}; sleep 300; fi'
    job = d.submit("sh", "-c", script)
    d.wait_for(marker.exists, what="the job to start")
    assert d.show(job)["gpus"] == [0]
    # Healthy jobs on the other card and on a CPU slot: their keepers hold them through
    # the exit, and the next daemon takes them back.
    fifos = {name: d.root / f"{name}.fifo" for name in ("card1", "cpu")}
    for fifo in fifos.values():
        os.mkfifo(fifo)
    healthy = {
        "card1": d.submit("sh", "-c", f"read c < {fifos['card1']}; exit $c", gpus=1),
        "cpu": d.submit("sh", "-c", f"read c < {fifos['cpu']}; exit $c", gpus=0),
    }
    pids = {name: d.wait_pid(j) for name, j in healthy.items()}
    assert d.show(healthy["card1"])["gpus"] == [1]
    d.set_card(0, wedged=True)
    wedged_at = time.monotonic()
    d.append_kernel(XID_109_CARD0)
    assert d.proc is not None
    code = d.proc.wait(timeout=60)
    took = time.monotonic() - wedged_at
    assert code == 70
    log = d.log_text()
    assert "CRITICAL" in log.upper()
    assert "deadline" in log
    assert f"job-{job}" in log  # what was being aborted, named
    assert "nvidia-smi" in log
    assert "Xid" in log  # the last kernel-log lines seen
    d.set_card(0, wedged=False)
    d.start()
    done = d.wait_done(job)
    assert done["state"] == "succeeded"
    assert done["retries"]["ordinary"]["used"] == 0
    first, second = done["attempts"]  # the wedged attempt is the only one lost
    assert first["reason"] in ("gpu_hang", "interrupted") and second["reason"] is None
    for name, job_id in healthy.items():
        shown = d.show(job_id)
        assert shown["state"] == "running"
        assert [(a["n"], a["pid"]) for a in shown["attempts"]] == [(1, pids[name])]
        fifos[name].write_text("0\n")
        ended = d.wait_done(job_id)
        assert ended["state"] == "succeeded" and len(ended["attempts"]) == 1
    health = d.cli("health", check=False)
    assert health.returncode == 1 and "deadman" in health.stdout
    print(f"card wedged -> exit 70: {took:.2f}s (deadline 2 s)")


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []

    def drain(self, seconds: float) -> list[str]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
        return [m for _, m in self.messages]

    def wait_count(self, message: str, n: int, after: float, seconds: float = 30.0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if sum(1 for at, m in self.messages if m == message and at > after) >= n:
                return
            self.drain(0.2)
        raise AssertionError(f"fewer than {n} {message!r} in {self.messages}")

    def wait_for(self, text: str, seconds: float = 20.0) -> float:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for at, message in self.messages:
                if text in message:
                    return at
            self.drain(0.2)
        raise AssertionError(f"no {text!r} in {self.messages}")


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.sock.close()


def test_sd_notify_ready_status_watchdog_and_stopping(
    make_daemon: Callable[..., Daemon], notify: NotifySocket, tmp_path: Path
) -> None:
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"}
    d = make_daemon(env=env, start=False)
    started = time.monotonic()
    d.start(wait=False)
    ready_at = notify.wait_for("READY=1")
    print(f"process start -> READY=1: {ready_at - started:.2f}s")
    notify.wait_for("STATUS=")
    status = next(m for _, m in notify.messages if m.startswith("STATUS="))
    assert "GPUs 2/2 ok" in status and "running" in status
    notify.wait_count("WATCHDOG=1", 3, after=ready_at)  # every WATCHDOG_USEC/2 = 0.5 s
    job = d.submit("sleep", "300")
    d.wait_state(job, "running")
    notify.wait_for("1 running")
    assert d.stop(signal.SIGTERM) == 0
    notify.drain(0.3)
    assert any(m == "STOPPING=1" for _, m in notify.messages)
