"""A daemon with a large queue, and one with a large history: batch submit, dispatch
latency, `list`, memory, restart -> READY and idle CPU."""

from __future__ import annotations

import signal
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

from .harness import BenchDaemon, submit_request, summary, time_command, wait_until
from .history import write_history
from .jobs import MARK, _mark_time

CHUNK = 10_000


def _cli_batch(d: BenchDaemon, count: int) -> dict[str, Any]:
    """`gpusv submit --batch FILE`: one id per line, in order, all committed."""
    path = d.root / "batch.txt"
    path.write_text("true\n" * count)
    began = time.perf_counter()
    done = subprocess.run(
        [str(d.bin / "gpusv"), "submit", "--batch", str(path)],
        env=d.env,
        cwd=d.root,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - began
    lines = done.stdout.splitlines()
    ids = [int(line) for line in lines]
    assert len(ids) == count and ids == sorted(ids), "one increasing id per line expected"
    return {"jobs": count, "wall_s": round(wall, 3), "jobs_per_s": round(count / wall, 1)}


def _fill(d: BenchDaemon, queued: int) -> dict[str, Any]:
    first = min(CHUNK, queued)
    out: dict[str, Any] = {"cli_batch": _cli_batch(d, first)}
    walls = []
    for start in range(first, queued, CHUNK):
        count = min(CHUNK, queued - start)
        began = time.perf_counter()
        d.call(submit_request(d.root, [["true"]] * count))
        walls.append((count, time.perf_counter() - began))
    if walls:
        total = sum(c for c, _ in walls)
        out["socket_batches"] = {
            "requests": len(walls),
            "jobs_per_s": round(total / sum(w for _, w in walls), 1),
        }
    return out


def _gpus(d: BenchDaemon) -> list[dict[str, Any]]:
    return list(d.call({"type": "gpus"})["gpus"])


def _held(d: BenchDaemon) -> int:
    return int(sum(d.call({"type": "stats"})["held"].values()))


def _dispatch_latency(d: BenchDaemon, repeats: int) -> list[float]:
    marks = d.root / "marks"
    marks.mkdir(exist_ok=True)
    out = []
    for i in range(repeats):
        mark = marks / f"cpu-{i}"
        sent = time.time()
        ids = d.call(submit_request(d.root, [["sh", "-c", MARK.format(mark)]], gpus=0))["ids"]
        out.append(wait_until(partial(_mark_time, mark), 60, "the CPU job") - sent)
        d.wait_jobs(ids)
    return out


def _list_ms(d: BenchDaemon, runs: int) -> dict[str, Any]:
    walls = []
    for _ in range(runs):
        began = time.perf_counter()
        d.call({"type": "list"})
        walls.append(time.perf_counter() - began)
    cli = time_command([str(d.bin / "gpusv"), "list"], d.env, max(3, runs // 2), d.root)
    return {"socket_ms": summary(walls), "gpusv_list_ms": summary(cli)}


def measure_queue(root: Path, queued: int, repeats: int) -> dict[str, Any]:
    """Both cards busy with long jobs, `queued` GPU jobs waiting, CPU jobs dispatched."""
    config = f"cpu_slots = 2\nmax_queued_per_user = {queued + 10 * CHUNK}\n"
    with BenchDaemon(root, config=config) as d:
        d.start()
        busy = d.call(submit_request(d.root, [["sleep", "3600"]] * 2))["ids"]
        wait_until(lambda: all(g["running_jobs"] for g in _gpus(d)), 30, "both cards busy")
        out: dict[str, Any] = {"queued": queued, **_fill(d, queued)}
        began = time.perf_counter()
        wait_until(lambda: _held(d) >= queued, 600, "every job held", poll=0.05)
        out["hold_all_s"] = round(time.perf_counter() - began, 3)
        out["cpu_dispatch_latency_ms"] = summary(_dispatch_latency(d, repeats))
        out["list"] = _list_ms(d, repeats)
        out["rss_mb"] = d.rss_mb()
        d.stop(signal.SIGTERM)
        out["restart_ready_s"] = round(d.start(timeout=300), 3)
        d.call({"type": "cancel", "ids": busy})
    return out


def measure_history(
    root: Path, jobs: int, idle_s: float, restarts: int = 3, list_runs: int = 10
) -> dict[str, Any]:
    """A daemon over `jobs` finished jobs: restart -> READY, RSS, `list`, idle CPU."""
    out: dict[str, Any] = {"jobs": jobs}
    with BenchDaemon(root) as d:
        out["write_history_s"] = round(write_history(d.state, jobs), 3)
        ready = []
        for _ in range(restarts):
            ready.append(d.start(timeout=300))
            d.stop(signal.SIGTERM)
        out["restart_ready_s"] = {
            "p50": round(statistics.median(ready), 3),
            "max": round(max(ready), 3),
        }
        d.start(timeout=300)
        out["list"] = _list_ms(d, list_runs)
        time.sleep(min(2.0, idle_s))  # let start-up work settle before the idle window
        out["rss_mb"] = d.rss_mb()
        cpu0 = d.cpu_s()
        time.sleep(idle_s)
        out["idle_cpu_pct"] = round(100 * (d.cpu_s() - cpu0) / idle_s, 3)
        out["idle_s"] = idle_s
    return out
