"""The card idle gap: from one job's end to the next job's start on the same card.
`python -m bench.gap [--jobs 300] [--job-s 0.05] [--rounds 1]`.

A fresh daemon on 2 simulated cards takes `--jobs` short jobs of one GPU each in one
batch; each job (`bash -c`) marks its own first and last act (bash's `$EPOCHREALTIME`)
and sleeps `--job-s` between them. The gap is measured two ways, per card, between jobs
that follow each other on it:

- `records_ms`: the next attempt's `started_at` less the previous one's `ended_at`, as the
  daemon recorded them (milliseconds, the records' resolution): the daemon's own view,
  from the exit it was told of to the start it recorded.
- `jobs_ms`: the next job's first mark less the previous job's last one: the wall time the
  card had no job's code running, the start and end of both jobs' `bash` included.

Each also split by whether the next job was claimed before the previous one ended
(`ahead`: its keeper held it and started it at the exit) or not (`not_ahead`: the exit
went to the daemon, which claimed the next job and asked the keeper to start it).

`floor_ms`: the same gap with no supervisor, the jobs (each sleeping `--job-s`) run one
after the other by `subprocess.run` from the bench: the jobs' own fork/exec, and the
machine's load, with nothing of gpusv's.

Also: the daemon's CPU per job and the load average before and after.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from supervisor.daemon.clock import epoch_from_iso

from .harness import BenchDaemon, fresh_rounds, submit_request

# bash's own clock, not `date`: the marks are the job's first and last acts, with no
# process of their own between the mark and the job's start or end.
JOB = "echo $EPOCHREALTIME > {first}; sleep {job_s}; echo $EPOCHREALTIME > {last}"


def percentiles(samples: list[float]) -> dict[str, float]:
    """n, p50, p90, p99 and max of `samples` (seconds), in ms."""
    xs = sorted(samples)
    if not xs:
        return {"n": 0}

    def at(q: float) -> float:
        return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000, 2)

    return {"n": len(xs), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


def pairs(runs: list[tuple[int, float, float, float]]) -> list[tuple[float, bool]]:
    """From (card, start, end, claimed) of every run: each card's gaps, end -> the next
    start, and whether that next run was claimed before the end (started ahead: its keeper
    held it and started it at the exit, with no round trip through the daemon)."""
    out: list[tuple[float, bool]] = []
    by_card: dict[int, list[tuple[float, float, float]]] = {}
    for card, start, end, claimed in runs:
        by_card.setdefault(card, []).append((start, end, claimed))
    for spans in by_card.values():
        spans.sort()
        out += [(nxt[0] - prev[1], nxt[2] < prev[1]) for prev, nxt in itertools.pairwise(spans)]
    return out


def gaps(runs: list[tuple[int, float, float]]) -> list[float]:
    """From (card, start, end) of every run: each card's gaps, end -> the next start."""
    return [gap for gap, _ in pairs([(*run, 0.0) for run in runs])]


def _mark(path: Path) -> float:
    return float(path.read_text().strip())


def floor(marks: Path, jobs: int, job_s: float) -> list[float]:
    """The gaps of `jobs` such jobs run one after the other with no supervisor."""
    runs = []
    for i in range(jobs):
        first, last = marks / f"floor-{i}.s", marks / f"floor-{i}.e"
        subprocess.run(["bash", "-c", JOB.format(first=first, last=last, job_s=job_s)], check=True)
        runs.append((0, _mark(first), _mark(last)))
    return gaps(runs)


def measure(root: Path, jobs: int, job_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": jobs, "job_s": job_s, "load_1m": [os.getloadavg()[0]]}
    marks = root / "marks"
    marks.mkdir(parents=True)
    with BenchDaemon(root / "d") as d:
        d.start()
        time.sleep(0.5)
        argvs = [
            ["bash", "-c", JOB.format(first=marks / f"{i}.s", last=marks / f"{i}.e", job_s=job_s)]
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
            job = d.call({"type": "show", "ids": [job_id]})["job"]
            (attempt,) = job["attempts"]
            card = attempt["gpus"][0]
            start, end = epoch_from_iso(attempt["started_at"]), epoch_from_iso(attempt["ended_at"])
            # The `started` event is the claim: before the job in front ended, if ahead.
            claimed = min(epoch_from_iso(e["at"]) for e in job["events"] if e["kind"] == "started")
            recorded.append((card, start, end, claimed))
            own.append((card, _mark(marks / f"{i}.s"), _mark(marks / f"{i}.e"), claimed))
    for name, runs in (("records_ms", recorded), ("jobs_ms", own)):
        both = pairs(runs)
        out[name] = percentiles([gap for gap, _ in both])
        out[name]["ahead"] = percentiles([gap for gap, ahead in both if ahead])
        out[name]["not_ahead"] = percentiles([gap for gap, ahead in both if not ahead])
    out["floor_ms"] = percentiles(floor(marks, min(jobs, 100), job_s))
    out["load_1m"].append(os.getloadavg()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gap", description=__doc__)
    p.add_argument("--jobs", type=int, default=300, help="short jobs, one GPU each")
    p.add_argument("--job-s", dest="job_s", type=float, default=0.05, help="each job's sleep")
    p.add_argument("--rounds", type=int, default=1, help="fresh daemons, one after the other")
    p.add_argument("--out", type=Path, default=Path("bench/results/gap.json"))
    a = p.parse_args(argv)
    return fresh_rounds("gpusv-gap-", a.rounds, lambda tmp: measure(tmp, a.jobs, a.job_s), a.out)


if __name__ == "__main__":
    sys.exit(main())
