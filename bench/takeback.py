"""Take-back after a crash: `python -m bench.takeback [--jobs 1000] [--rounds 1]`.

A fresh daemon on 2 simulated cards with `cpu_slots = --jobs` runs `--jobs` CPU jobs
(`sleep`, `--gpus 0`) at once; once all are running it is killed (`kill -9`) and started
again on the same state. Measured from the new process's start:

- `serving_s`: until it answers a request (a ping: it serves once it has taken back its
  running jobs from their keepers and reconciled its records);
- `new_job_started_s`: until a job submitted as soon as it serves (one GPU, a free card)
  has started: its own first act, a `date +%s.%N` into a file;
- and that every job that ran before the kill is still running, and none twice.

Also the daemon's RSS and the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from supervisor.wire.protocol import MAX_LIST

from .harness import BenchDaemon, fresh_rounds, submit_request, wait_until
from .jobs import MARK, _mark_time


def _states(d: BenchDaemon, ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in d.call({"type": "list", "limit": MAX_LIST})["jobs"]:
        if job["id"] in ids:
            counts[job["state"]] = counts.get(job["state"], 0) + 1
    return counts


def measure(root: Path, jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": jobs, "load_1m": [os.getloadavg()[0]]}
    config = f"cpu_slots = {jobs}\nmax_queued_per_user = {jobs + 10}\n"
    with BenchDaemon(root / "d", config=config) as d:
        d.start()
        began = time.perf_counter()
        ids = d.call(submit_request(d.root, [["sleep", "3600"]] * jobs, gpus=0))["ids"]
        # A job is `running` from its claim on; its process comes a moment later.
        wait_until(lambda: len(_job_pids(d.root)) == jobs, 300, "every job's process", 0.2)
        assert _states(d, ids) == {"running": jobs}
        out["all_running_s"] = round(time.perf_counter() - began, 2)
        out["rss_before_mb"] = d.rss_mb()
        pids = _job_pids(d.root)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGKILL)  # no stop: its keepers and jobs go on
        d.proc.wait()
        if d._client is not None and d._client.sock is not None:
            d._client.sock.close()
        d._client = None
        mark = d.root / "new-job"
        out["serving_s"] = round(d.start(timeout=120), 3)
        restarted = d.process().create_time()
        sent = time.time()
        d.call(submit_request(d.root, [["sh", "-c", MARK.format(mark)]], gpus=1))
        started = wait_until(partial(_mark_time, mark), 60, "the new job")
        out["new_job_started_s"] = round(started - restarted, 3)
        out["submit_to_start_ms"] = round((started - sent) * 1000, 1)
        out["after"] = _states(d, ids)
        out["rss_after_mb"] = d.rss_mb()
        after = _job_pids(d.root)
        out["job_processes"] = {"before": len(pids), "after": len(after), "kept": len(pids & after)}
    assert out["after"] == {"running": jobs}, f"not every job taken back: {out['after']}"
    assert len(pids) == jobs and pids <= after, f"job processes: {out['job_processes']}"
    out["load_1m"].append(os.getloadavg()[0])
    return out


def _job_pids(root: Path) -> set[int]:
    """The processes of this daemon's jobs (the `sleep`s, by their environment)."""
    out = set()
    for proc in psutil.process_iter(["environ", "name"]):
        with contextlib.suppress(psutil.Error):
            env = proc.info["environ"] or {}
            if proc.info["name"] == "sleep" and env.get("BENCH_ROOT") == str(root):
                out.add(proc.pid)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.takeback", description=__doc__)
    p.add_argument("--jobs", type=int, default=1000, help="running jobs at the kill")
    p.add_argument("--rounds", type=int, default=1, help="fresh daemons, one after the other")
    p.add_argument("--out", type=Path, default=Path("bench/results/takeback.json"))
    a = p.parse_args(argv)
    return fresh_rounds("gpusv-takeback-", a.rounds, lambda tmp: measure(tmp, a.jobs), a.out)


if __name__ == "__main__":
    sys.exit(main())
