"""A real gpusvd in a subprocess, on simulated GPUs, a temp state dir and a file kernel log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.client.cli import Client, Refused, Unreachable
from supervisor.gpus.allocation import ALLOCATION_VARIABLES


class Daemon:
    def __init__(self, root: Path, gpus: str | None, config: str, env: dict[str, str]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.state = root / "state"
        self.socket = root / "gpusvd.sock"
        self.kernel_log = root / "kern.log"
        self.kernel_log.touch()
        self.kernel_source = f"file:{self.kernel_log}"  # or "kmsg": the real /dev/kmsg
        self.config = root / "gpusvd.toml"
        self.config.write_text(config)
        self.log = root / "daemon.log"
        self.gpus = gpus
        self.python = sys.executable  # one its jobs may run (root's own may be out of reach)
        self.env = {
            # A visibility variable of the test runner's own would restrict the cards.
            **{k: v for k, v in os.environ.items() if k not in ALLOCATION_VARIABLES},
            "PYTHONUNBUFFERED": "1",
            "GPUSV_TEST_ROOT": str(root),
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "supervisor.daemon.life.app",
            "--config",
            str(self.config),
            "--state-dir",
            str(self.state),
            "--socket",
            str(self.socket),
            "--kernel-log",
            self.kernel_source,
        ]
        if self.gpus:
            argv += ["--simulate-gpus", self.gpus]
        return argv

    def start(self, wait: bool = True) -> Daemon:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"gpusvd exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                self.call({"type": "ping"})
                return
            except (Unreachable, OSError):
                time.sleep(0.05)
            except Refused as exc:  # waiting for space: its socket answers `storage`
                if exc.code != "storage":
                    raise
                time.sleep(0.05)
        raise AssertionError(f"gpusvd not ready in {timeout}s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        return Client(self.socket).call(request)

    def cli_argv(self) -> list[str]:
        """`gpusv` up to its arguments."""
        return [sys.executable, "-m", "supervisor.client.cli", "--socket", str(self.socket)]

    def cli(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.cli_argv(), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            env=self.env,
            cwd=self.root,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"gpusv {' '.join(args)} exited {result.returncode}: {result.stderr}"
            )
        return result

    def submit(self, *argv: str, **opts: Any) -> int:
        env = {"PATH": os.environ["PATH"], "GPUSV_TEST_ROOT": str(self.root)}
        env.update(opts.pop("env", {}))
        request = {"type": "submit", "argv": list(argv), "cwd": str(self.root), "env": env}
        request.update(opts)
        return int(self.call(request)["ids"][0])

    def show(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.call({"type": "show", "ids": [job_id]})["job"]
        return job

    def wait_for(
        self, predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition"
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(
            f"timed out waiting for {what}\n--- daemon log ---\n{self.log_text()[-6000:]}"
        )

    def wait_state(self, job_id: int, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        job: dict[str, Any] = self.wait_for(
            lambda: (j := self.show(job_id))["state"] in states and j,
            timeout,
            f"job {job_id} in {states}",
        )
        return job

    def wait_pid(self, job_id: int, timeout: float = 20.0) -> int:
        """The running attempt's leader pid, once recorded (it is written after `running`)."""

        def pid() -> int | None:
            job = self.show(job_id)
            attempts = job["attempts"]
            return attempts[-1]["pid"] if job["state"] == "running" and attempts else None

        return int(self.wait_for(pid, timeout, f"job {job_id} running with its pid recorded"))

    def wait_done(self, job_id: int, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=timeout)

    def append_kernel(self, line: str) -> None:
        with open(self.kernel_log, "a") as fh:
            fh.write(line + "\n")

    def set_card(self, index: int, **values: Any) -> None:
        from supervisor.gpus import write_control

        write_control(self.state, index, **values)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"gpusvd did not stop on {sig}:\n{self.log_text()[-4000:]}"
            ) from None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    daemons: list[Daemon] = []

    def make(
        gpus: str | None = "2x8G",
        config: str = "",
        env: dict[str, str] | None = None,
        start: bool = True,
    ) -> Daemon:
        d = Daemon(tmp_path / f"d{len(daemons)}", gpus, config, env or {})
        daemons.append(d)
        return d.start() if start else d

    yield make
    for d in daemons:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
        _kill_keepers(d)
        _kill_jobs(d)


def _kill_keepers(d: Daemon) -> None:
    """Keepers outlive their daemon by design: a test's die with it, with their jobs."""
    from supervisor.daemon.running.keeper_processes import abandon

    abandon(d.state)


def _kill_jobs(d: Daemon) -> None:
    """Nothing a test started may outlive it."""
    import psutil

    for proc in psutil.process_iter(["environ"]):
        try:
            env = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if "GPUSV_JOB_ID" in env and env.get("GPUSV_TEST_ROOT") == str(d.root):
            proc.kill()


@pytest.fixture
def daemon(make_daemon: Callable[..., Daemon]) -> Daemon:
    return make_daemon()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)


# ---- a user's own gpusvd ---------------------------------------------------------------


@pytest.fixture(scope="session")
def own_user() -> Iterator[OwnUser]:
    """The test user that runs its own gpusvd (skips where users cannot be made)."""
    yield from own_user_setup()


@pytest.fixture
def make_own_daemon(own_user: OwnUser) -> Iterator[Callable[..., Daemon]]:
    """Like make_daemon, but gpusvd runs as the test user: no cgroups, no setuid."""
    yield from make_own(own_user)


AS_A_USER = "making a test user, and starting its gpusvd as it"


@pytest.fixture(params=["root", pytest.param("user", marks=pytest.mark.root(AS_A_USER))])
def make_any_daemon(request: pytest.FixtureRequest) -> Callable[..., Daemon]:
    """make_daemon both ways, for a behaviour that a user's gpusvd keeps without root:
    by root (cgroups), and by an ordinary user (the fallbacks)."""
    name = "make_daemon" if request.param == "root" else "make_own_daemon"
    make: Callable[..., Daemon] = request.getfixturevalue(name)
    return make


@pytest.fixture
def any_daemon(make_any_daemon: Callable[..., Daemon]) -> Daemon:
    return make_any_daemon()


from .unprivileged import OwnUser, make_own, own_user_setup  # noqa: E402  (needs Daemon)
