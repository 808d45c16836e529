"""The card idle gap: from one job's end to the next job's start on the same card.
`python -m bench.gap [--jobs 300] [--job-s 0.05] [--rounds 1]`.

A fresh daemon on 2 simulated cards takes `--jobs` short jobs of one GPU each in one
batch; each job marks its own first and last act (`date +%s.%N`) and sleeps `--job-s`
between them. The gap is measured two ways, per card, between jobs that follow each other
on it:

- `records_ms`: the next attempt's `started_at` less the previous one's `ended_at`, as the
  daemon recorded them (milliseconds, the records' resolution): the daemon's own view,
  from the exit it was told of to the start it recorded.
- `jobs_ms`: the next job's first mark less the previous job's last one: the wall time the
  card had no job's code running, the `sh` and `date` of both jobs included (about 1-2 ms
  of fork/exec of the jobs themselves).

Also: the daemon's CPU per job and the load average before and after.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from supervisor.daemon.clock import epoch_from_iso

from .harness import BenchDaemon, submit_request

JOB = "date +%s.%N > {first}; sleep {job_s}; date +%s.%N > {last}"


def percentiles(samples: list[float]) -> dict[str, float]:
    """n, p50, p90, p99 and max of `samples` (seconds), in ms."""
    xs = sorted(samples)
    if not xs:
        return {"n": 0}

    def at(q: float) -> float:
        return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000, 2)

    return {"n": len(xs), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


def gaps(runs: list[tuple[int, float, float]]) -> list[float]:
    """From (card, start, end) of every run: each card's gaps, end -> the next start."""
    out: list[float] = []
    by_card: dict[int, list[tuple[float, float]]] = {}
    for card, start, end in runs:
        by_card.setdefault(card, []).append((start, end))
    for spans in by_card.values():
        spans.sort()
        out += [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(spans)]
    return out


def _mark(path: Path) -> float:
    return float(path.read_text().strip())


def measure(root: Path, jobs: int, job_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": jobs, "job_s": job_s, "load_1m": [os.getloadavg()[0]]}
    marks = root / "marks"
    marks.mkdir(parents=True)
    with BenchDaemon(root / "d") as d:
        d.start()
        time.sleep(0.5)
        argvs = [
            ["sh", "-c", JOB.format(first=marks / f"{i}.s", last=marks / f"{i}.e", job_s=job_s)]
            for i in range(jobs)
        ]
        cpu0, began = d.cpu_s(), time.perf_counter()
        ids = d.call(submit_request(d.root, argvs, gpus=1))["ids"]
        done = d.wait_jobs(ids)
        out["wall_s"] = round(time.perf_counter() - began, 2)
        out["daemon_cpu_ms_per_job"] = round((d.cpu_s() - cpu0) * 1000 / jobs, 3)
        assert all(j["state"] == "succeeded" for j in done), "a job did not succeed"
        recorded, own = [], []
        for i, job_id in enumerate(ids):
            (attempt,) = d.call({"type": "show", "ids": [job_id]})["job"]["attempts"]
            card = attempt["gpus"][0]
            start, end = epoch_from_iso(attempt["started_at"]), epoch_from_iso(attempt["ended_at"])
            recorded.append((card, start, end))
            own.append((card, _mark(marks / f"{i}.s"), _mark(marks / f"{i}.e")))
    out["records_ms"] = percentiles(gaps(recorded))
    out["jobs_ms"] = percentiles(gaps(own))
    out["load_1m"].append(os.getloadavg()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gap", description=__doc__)
    p.add_argument("--jobs", type=int, default=300, help="short jobs, one GPU each")
    p.add_argument("--job-s", dest="job_s", type=float, default=0.05, help="each job's sleep")
    p.add_argument("--rounds", type=int, default=1, help="fresh daemons, one after the other")
    p.add_argument("--out", type=Path, default=Path("bench/results/gap.json"))
    a = p.parse_args(argv)
    rounds = []
    for _ in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="gpusv-gap-") as tmp:
            rounds.append(measure(Path(tmp), a.jobs, a.job_s))
    print(json.dumps(rounds, indent=1))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rounds, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
