"""The benchmark: `python -m bench.run [--quick] [--out FILE] [--only SECTION,...]`.

Starts gpusvd on simulated GPUs in a temporary directory, measures, prints a table with
the targets as PASS/FAIL lines, and writes every figure as JSON (docs/performance.md
says what each one means).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from supervisor.daemon.life import log_setup as logs
from supervisor.daemon.watch.memory import measure_sampler_cost

from . import keeper, report
from .client import measure_client
from .dispatch import dispatch_cost
from .harness import BenchDaemon
from .jobs import measure_handover, measure_hang, measure_latency, measure_throughput
from .scale import measure_history, measure_queue
from .tsp import measure_tsp


@dataclass(frozen=True)
class Sizes:
    cli_runs: int
    latency_jobs: int
    throughput_jobs: int
    hang_repeats: int
    dispatch_queues: tuple[int, ...]
    big: int  # jobs queued, and jobs of history
    idle_s: float
    restarts: int
    handover_jobs: int


FULL = Sizes(30, 50, 1000, 5, (100, 10_000, 100_000), 100_000, 30.0, 3, 300)
QUICK = Sizes(10, 15, 200, 2, (100, 10_000), 10_000, 10.0, 3, 100)
TINY = Sizes(3, 3, 20, 1, (10, 100), 200, 1.0, 1, 6)  # the smoke test's


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _fresh(root: Path, s: Sizes, r: dict[str, Any]) -> None:
    """One daemon: idle RSS, the client, latency, throughput on cards, the hang."""
    # An installed system loads byte-compiled modules (pip compiles at install, and so
    # does the stdlib's install); the bench's bytecode cache starts empty, and a daemon
    # that compiles some 300 modules keeps the compiler's leftovers. One start fills it.
    with BenchDaemon(root / "prime") as primer:
        primer.start()
    with BenchDaemon(root / "fresh") as d:
        d.start()
        time.sleep(1.0)
        r["idle_rss_mb"] = d.rss_mb()
        r["client"] = measure_client(d, s.cli_runs)
        r["latency"] = measure_latency(d, s.latency_jobs)
        r["throughput_gpu"] = measure_throughput(d, s.throughput_jobs, gpus=1)
        r.setdefault("keeper_rss_mb", {}).update(d.keeper_rss_mb())
        r["hang"] = measure_hang(d, s.hang_repeats)


CPU_SLOTS = 2  # as many as Task Spooler's slots in the same run: equal concurrency


def _cpu_slots(root: Path, s: Sizes, r: dict[str, Any]) -> None:
    with BenchDaemon(root / "cpu", config=f"cpu_slots = {CPU_SLOTS}\n") as d:
        d.start()
        r["throughput_cpu"] = measure_throughput(d, s.throughput_jobs, gpus=0)
        r["throughput_cpu"]["cpu_slots"] = CPU_SLOTS
        r.setdefault("keeper_rss_mb", {}).update(d.keeper_rss_mb())


def _keepers(root: Path, s: Sizes, r: dict[str, Any]) -> None:
    """The execution layer with no daemon in front of it, at the same concurrency: the
    ceiling of what gpusv's jobs/s can be on this machine (bench.keeper says how)."""
    alone = keeper.measure(root / "keepers", s.throughput_jobs, CPU_SLOTS, with_tsp=False)
    kept = ("spawn_latency_ms", "one_keeper", "keeper_per_slot")
    r["keepers_alone"] = {k: alone[k] for k in kept}


def _handover(root: Path, s: Sizes, r: dict[str, Any]) -> None:
    """Short jobs (20 ms), with and without starting ahead, one after the other."""
    out: dict[str, Any] = {}
    for mode, ahead_s in (("off", 0), ("on", 2)):
        config = f"cpu_slots = {CPU_SLOTS}\n[jobs]\nstart_ahead_s = {ahead_s}\n"
        with BenchDaemon(root / f"handover-{mode}", config=config) as d:
            d.start()
            out[mode] = measure_handover(d, s.handover_jobs, 0.02, CPU_SLOTS)
    r["handover"] = out


def _sampler(_root: Path, _s: Sizes, r: dict[str, Any]) -> None:
    cost = measure_sampler_cost(jobs=10, per_job=3, passes=50)
    interval = 0.5  # [host_memory] sample_interval_s default
    per_job = cost["cpu_s_per_job_per_pass"] / interval
    r["sampler"] = {**cost, "interval_s": interval, "cpu_pct_per_job": round(100 * per_job, 4)}


SECTIONS: dict[str, Callable[[Path, Sizes, dict[str, Any]], None]] = {
    "fresh": _fresh,
    "cpu": _cpu_slots,
    "keepers": _keepers,
    "handover": _handover,
    "tsp": lambda root, s, r: r.update(tsp=measure_tsp(root / "tsp", s.throughput_jobs)),
    "sampler": _sampler,
    "dispatch": lambda root, s, r: r.update(dispatch=dispatch_cost(root, s.dispatch_queues)),
    "queue": lambda root, s, r: r.update(
        queue=measure_queue(root / "queue", s.big, min(10, s.cli_runs))
    ),
    "history": lambda root, s, r: r.update(
        history=measure_history(root / "history", s.big, s.idle_s, s.restarts, s.cli_runs)
    ),
}


def run(sizes: Sizes, only: list[str], workdir: Path) -> dict[str, Any]:
    logs.configure("console", "warning")  # the in-process store and scheduler: quiet
    results: dict[str, Any] = {"machine": _machine(), "sizes": sizes.__dict__}
    for name, section in SECTIONS.items():
        if only and name not in only:
            continue
        began = time.perf_counter()
        section(workdir, sizes, results)
        results.setdefault("section_s", {})[name] = round(time.perf_counter() - began, 1)
        sys.stderr.write(f"bench: {name} done in {results['section_s'][name]} s\n")
    results["targets"] = [t.__dict__ for t in report.targets(results)]
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller sizes, about a minute")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("bench/results/latest.json"))
    p.add_argument("--only", default="", help=f"comma-separated: {','.join(SECTIONS)}")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = p.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    sizes = TINY if a.tiny else QUICK if a.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="gpusv-bench-"))
    try:
        results = run(sizes, only, workdir)
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report.table(results))
    print(f"\nwritten: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
