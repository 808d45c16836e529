"""A real gpusvd in a temporary directory on simulated GPUs, and the timing helpers that
every measurement shares.

Child processes (the daemon, the CLI) run with byte-compiled modules, as an installed
package has them: PYTHONDONTWRITEBYTECODE is dropped and the bytecode goes to a cache
under the bench's own directory, so that nothing is written into the source tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from supervisor.client.cli import Client, Unreachable
from supervisor.daemon.running import keeper_processes as keeper_procs

PY = sys.executable
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
GPUSV_VENVS = REPO / ".bench-gpusv"  # environments made with other interpreters
XID_109 = (  # a real line (shared kernel-log corpus); simulated card i is PCI 0000:{i+1}:00
    "[10900.272611] NVRM: Xid (PCI:0000:{bus:02x}:00): 109, pid=11263, name=Renderer, "
    "Ch 00000020, errorString CTX SWITCH TIMEOUT, Info 0xac00d"
)


def gpusv_env(base: Path) -> Path:
    """The interpreter of an environment made with `base` (a python3), gpusv installed in
    it from this checkout, editable: the same code as the bench's own gpusv runs. Editable
    as a plain path in a `.pth` (setuptools' `editable_mode=compat`), not by its import
    hook, which a wheel's install has not either: the hook imports pathlib, re and
    urllib.parse at every start, 10-12 ms of each `gpusv` command's."""
    name = str(base.resolve()).strip("/").replace("/", "-")
    python = GPUSV_VENVS / name / "bin" / "python"
    probe = [str(python), "-c", "import supervisor, aiosqlite, anyio, psutil, structlog"]
    hooked = list(python.parent.parent.glob("lib/python*/site-packages/__editable___*finder.py"))
    if (
        python.exists()
        and not hooked
        and subprocess.run(probe, capture_output=True).returncode == 0
    ):
        return python
    subprocess.run([str(base), "-m", "venv", "--clear", str(python.parent.parent)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    compat = ["--config-settings", "editable_mode=compat"]
    subprocess.run([*pip, *compat, "-e", str(REPO)], check=True)
    return python


def child_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    env.update(extra)
    return env


def summary(samples: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """p50/p95/min of `samples` (seconds), in ms by default."""
    xs = sorted(samples)
    if not xs:
        return {"n": 0}
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return {
        "n": len(xs),
        "p50": round(statistics.median(xs) * scale, 3),
        "p95": round(p95 * scale, 3),
        "min": round(xs[0] * scale, 3),
    }


def time_command(
    argv: Sequence[str], env: dict[str, str], runs: int, cwd: Path, warmup: int = 2
) -> list[float]:
    """Wall seconds of each of `runs` executions (after `warmup` untimed ones)."""
    walls = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}")
        if i >= warmup:
            walls.append(wall)
    return walls


def machine_cpu_s() -> float:
    """CPU seconds spent by the whole machine so far, all CPUs together (a niced
    process's time is counted apart from `user`: a peer may nice its workers)."""
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


def cpu_shares() -> tuple[float, float]:
    """(all CPU time, the part of it stolen by the hypervisor) so far, in seconds: on a
    shared VM a spell of steal slows every figure of wall time taken in it."""
    t = psutil.cpu_times()
    steal = float(getattr(t, "steal", 0.0))
    busy = t.user + t.nice + t.system + t.irq + t.softirq  # guest time is in user already
    return float(busy + t.idle + getattr(t, "iowait", 0.0) + steal), steal


def steal_pct(before: tuple[float, float], after: tuple[float, float]) -> float:
    total = after[0] - before[0]
    return round(100 * (after[1] - before[1]) / total, 1) if total > 0 else 0.0


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.002) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


class BenchDaemon:
    """gpusvd as a subprocess: `python -m supervisor.daemon.life.app --simulate-gpus ...`."""

    def __init__(
        self, root: Path, *, gpus: str = "2x24G", config: str = "", python: Path | None = None
    ) -> None:
        self.root = root
        # The interpreter of an environment gpusv is installed in: the daemon, its
        # keepers (started with the daemon's interpreter) and the CLI all come from it.
        self.python = python or Path(PY)
        self.bin = self.python.parent
        root.mkdir(parents=True, exist_ok=True)
        self.state = root / "state"
        self.socket = root / "gpusvd.sock"
        self.kernel_log = root / "kern.log"
        self.kernel_log.touch()
        self.config = root / "gpusvd.toml"
        self.config.write_text(config)
        self.log = root / "daemon.log"
        self.gpus = gpus
        self.env = child_env(root.parent, GPUSV_SOCKET=str(self.socket), BENCH_ROOT=str(root))
        self.cwd: Path | None = None  # with PYTHONPATH: a directory with no `supervisor`
        self.proc: subprocess.Popen[bytes] | None = None
        self._client: Client | None = None

    def argv(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "supervisor.daemon.life.app",
            "--config",
            str(self.config),
            "--simulate-gpus",
            self.gpus,
            "--kernel-log",
            f"file:{self.kernel_log}",
            "--state-dir",
            str(self.state),
            "--socket",
            str(self.socket),
        ]

    def start(self, timeout: float = 60.0) -> float:
        """Start it; return seconds from the process start until a ping is answered."""
        with open(self.log, "ab") as log:
            started = time.perf_counter()
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpusvd exited {self.proc.returncode}:\n{self.tail()}")
            try:
                Client(self.socket).call({"type": "ping"})
                return time.perf_counter() - started
            except (Unreachable, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gpusvd not ready in {timeout}s:\n{self.tail()}") from None
                time.sleep(0.002)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    @property
    def client(self) -> Client:
        """One connection, kept: a socket request without the CLI's start-up."""
        if self._client is None:
            self._client = Client(self.socket)
        return self._client

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.client.call(request)

    def process(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def cpu_s(self) -> float:
        """The daemon's own CPU seconds (user + system), not its reaped children's."""
        times = self.process().cpu_times()
        return float(times.user + times.system)

    def keepers_cpu_s(self) -> float:
        """This daemon's keepers' CPU seconds (user + system), all of them together."""
        total = 0.0
        for proc in keeper_procs.keeper_processes(self.state / "keepers"):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss_mb(self) -> float:
        return round(self.process().memory_info().rss / 2**20, 1)

    def keeper_rss_mb(self) -> dict[str, float]:
        """Each keeper of this daemon's state dir (by its directory's name): RSS in MiB."""
        out = {}
        for proc in keeper_procs.keeper_processes(self.state / "keepers"):
            with contextlib.suppress(psutil.Error):
                home = next(a for a in proc.cmdline() if a.startswith(str(self.state)))
                out[Path(home).name] = round(proc.memory_info().rss / 2**20, 1)
        return out

    def wait_jobs(self, ids: Sequence[int], timeout: float = 600.0) -> list[dict[str, Any]]:
        """Every job terminal; `wait` takes at most 10,000 ids per request."""
        jobs: list[dict[str, Any]] = []
        for i in range(0, len(ids), 10_000):
            chunk = list(ids[i : i + 10_000])
            reply = self.call({"type": "wait", "ids": chunk, "timeout_s": timeout})
            if reply["timed_out"]:
                raise TimeoutError(f"jobs not done in {timeout}s:\n{self.tail()}")
            jobs += reply["jobs"]
        return jobs

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self._client is not None and self._client.sock is not None:
            self._client.sock.close()
        self._client = None
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        kill_leftover_jobs(self.root)

    def __enter__(self) -> BenchDaemon:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop(signal.SIGKILL)
        keeper_procs.abandon(self.state)  # they outlive a killed daemon by design


def fresh_rounds(
    prefix: str, rounds: int, measure: Callable[[Path], dict[str, Any]], out: Path
) -> int:
    """`measure` on a fresh temporary directory `rounds` times, one after the other; the
    figures printed and written to `out` as JSON."""
    found = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            found.append(measure(Path(tmp)))
    print(json.dumps(found, indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(found, indent=1) + "\n")
    return 0


def submit_request(root: Path, argvs: list[list[str]], **options: Any) -> dict[str, Any]:
    """A submit_batch request as `gpusv submit --batch` sends it (with a small env)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "BENCH_ROOT": str(root)}
    return {"type": "submit_batch", "argvs": argvs, "cwd": str(root), "env": env, **options}


def kill_leftover_jobs(root: Path) -> None:
    """No job the bench started outlives it (a killed daemon leaves its jobs behind)."""
    for proc in psutil.process_iter(["environ"]):
        with contextlib.suppress(psutil.Error):
            env = proc.info["environ"] or {}
            if "GPUSV_JOB_ID" in env and env.get("BENCH_ROOT") == str(root):
                proc.kill()
