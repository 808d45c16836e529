"""Submit to start through each system's CLI, beside Task Spooler, in turns:
`python -m bench.start [--runs 20]`.

Each run submits a job that writes its own start time (`date +%s%N`, then a rename, so
that a half-written file is never read) and takes the span from the CLI's exec to that
time: the client's start-up, its request, the daemon's commits and the job's fork. gpusv
runs from the bench's venv and from an installed layout (bench.client.installed_venv); a
job goes to a CPU slot (`--gpus 0`) so that no card's state comes into it. The three
take turns run by run, so the machine's load falls on all alike; each figure is the
median of the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .client import installed_venv
from .harness import BenchDaemon, summary
from .tsp import INSTALL_HINT


def _started(path: Path, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text()) / 1e9
        except (FileNotFoundError, ValueError):
            time.sleep(0.0005)
    raise TimeoutError(f"no start recorded in {path}")


def measure_start(root: Path, runs: int, warmup: int = 2) -> dict[str, Any]:
    tsp = shutil.which("tsp")
    tsp_env = {**os.environ, "TS_SOCKET": str(root / "tsp.sock"), "TMPDIR": str(root)}
    out: dict[str, Any] = {"load_1m": [round(os.getloadavg()[0], 2)]}
    with BenchDaemon(root / "d", config="cpu_slots = 2\n") as d:
        d.start()
        installed = str(installed_venv(d.root) / "bin" / "gpusv")
        clis: dict[str, tuple[list[str], dict[str, str]]] = {
            "gpusv": ([str(d.bin / "gpusv"), "submit", "--gpus", "0", "--"], d.env),
            "gpusv_installed": ([installed, "submit", "--gpus", "0", "--"], d.env),
        }
        if tsp is not None:
            subprocess.run([tsp, "-S", "2"], env=tsp_env, check=True, capture_output=True)
            clis["tsp"] = ([tsp], tsp_env)
        spans: dict[str, list[float]] = {who: [] for who in clis}
        try:
            for i in range(warmup + runs):
                for who, (cli, env) in clis.items():
                    mark = root / f"{who}-{i}"
                    job = ["sh", "-c", f"date +%s%N > {mark}.tmp && mv {mark}.tmp {mark}"]
                    began = time.time()
                    subprocess.run([*cli, *job], env=env, cwd=root, capture_output=True, check=True)
                    if i >= warmup:
                        spans[who].append(_started(mark) - began)
        finally:
            if tsp is not None:
                subprocess.run([tsp, "-K"], env=tsp_env, capture_output=True)
    for who, xs in spans.items():
        out[who] = summary(xs)
    if tsp is None:
        out["tsp"] = {"skipped": INSTALL_HINT}
    out["load_1m"].append(round(os.getloadavg()[0], 2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.start", description=__doc__)
    p.add_argument("--runs", type=int, default=20, help="runs of each CLI, taken in turns")
    p.add_argument("--out", type=Path, default=Path("bench/results/start.json"))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpusv-start-") as tmp:
        r = measure_start(Path(tmp), a.runs)
    for who in ("gpusv", "gpusv_installed", "tsp"):
        s = r.get(who, {})
        if "p50" in s:
            print(f"{who:16s} submit exec -> job start p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f}")
    if "p50" in r.get("tsp", {}):
        over = r["gpusv_installed"]["p50"] - r["tsp"]["p50"]
        print(f"installed gpusv over Task Spooler: {over:+.1f} ms (target: +20 ms at most)")
    print(f"load average (1 min) before and after: {r['load_1m']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
