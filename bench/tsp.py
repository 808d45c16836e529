"""Task Spooler (`tsp`) on the same trivial jobs, when it is installed; never installs it.

Task Spooler has no batch submit: each job is one `tsp true` (a small C client that stays
behind to run the job when the server lets it). `server_cpu_s` is the server alone, so
it leaves out the work its per-job clients do; `machine_cpu_s` (all CPUs, the whole
span) is the figure to compare with gpusv's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from .harness import machine_cpu_s, wait_until

INSTALL_HINT = "tsp not installed: apt-get install task-spooler (Debian/Ubuntu)"


def _server(sock: Path) -> psutil.Process | None:
    for proc in psutil.process_iter(["name", "environ"]):
        with contextlib.suppress(psutil.Error):
            env = proc.info["environ"] or {}
            if proc.info["name"] in ("tsp", "ts") and env.get("TS_SOCKET") == str(sock):
                return proc
    return None


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure_tsp(root: Path, jobs: int, slots: int = 2) -> dict[str, Any]:
    tsp = shutil.which("tsp")
    if tsp is None:
        return {"skipped": INSTALL_HINT}
    root.mkdir(parents=True, exist_ok=True)
    (root / "out").mkdir(exist_ok=True)
    sock = root / "tsp.sock"
    env = {
        **os.environ,
        "TS_SOCKET": str(sock),
        "TMPDIR": str(root / "out"),
        "TS_MAXFINISHED": str(jobs + 10),
    }

    def run(*args: str) -> str:
        return subprocess.run([tsp, *args], env=env, capture_output=True, text=True).stdout

    version = subprocess.run([tsp, "-V"], env=env, capture_output=True, text=True)
    run("-S", str(slots))
    server = wait_until(lambda: _server(sock), 10, "the tsp server", poll=0.01)
    try:
        cpu0, machine0 = _cpu(server), machine_cpu_s()
        began = time.perf_counter()
        ids = [run("true").strip() for _ in range(jobs)]
        submitted = time.perf_counter() - began
        # The server runs its queue in order, `slots` at a time: the last ones to start
        # are the last to end. Waiting on each job with a client of its own (1,000
        # processes) would charge the wait to Task Spooler; every job is checked after.
        for job_id in ids[-slots:]:
            run("-w", job_id)
        wall = time.perf_counter() - began
        cpu, machine = _cpu(server) - cpu0, machine_cpu_s() - machine0
        for job_id in ids[:-slots]:
            run("-w", job_id)
    finally:
        run("-K")
    return {
        "version": (version.stdout + version.stderr).strip().splitlines()[0],
        "jobs": jobs,
        "slots": slots,
        "submit_s": round(submitted, 3),
        "wall_s": round(wall, 3),
        "jobs_per_s": round(jobs / wall, 1),
        "server_cpu_s": round(cpu, 3),
        "machine_cpu_s": round(machine, 3),
    }
