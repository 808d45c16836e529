"""Where the daemon's per-job CPU goes, and what a big batch leaves in its memory:
`python -m bench.profile [--jobs 1000] [--dry-run 100000] [--queued 100000] [--run N]`.

1. A fresh daemon on 2 simulated cards runs `--jobs` trivial jobs from one
   `gpusv submit --batch -` while py-spy samples it (`py-spy record --nonblocking
   --rate 250 --format raw`: the daemon is never paused; a thread blocked in a waiting
   system call is idle and not sampled, one in a C call such as SQLite's commit is).
   Prints the share of samples by where they fall and writes the folded stacks
   (`bench/results/daemon.folded`, for flamegraph.pl or speedscope).
2. The same daemon then takes a `submit_batch` dry run of `--dry-run` jobs: its RSS idle,
   after the jobs, right after the dry run and 5 s later.
3. A fresh daemon, paused, takes the same dry run from idle (its RSS right after and 5 s
   later), then a real `submit_batch` of `--queued` jobs: its RSS once they are queued and
   5 s later (the queued jobs stay in memory: what each costs).
4. With `--run N`: a fresh daemon runs a batch of N trivial jobs (one `submit_batch`) to
   its end: its RSS idle, once they are queued, at the end, 5 s and 35 s later. 100,000
   take about 2.5 minutes here.

py-spy comes from PyPI into the venv the bench runs from (`pip install py-spy`); without
it part 1 is skipped. Attaching needs ptrace rights over the daemon (same user, and
kernel.yama.ptrace_scope 0 or 1 for a child, or root).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import BIN, BenchDaemon, submit_request
from .jobs import measure_throughput

# (what, frames that all mark it), first match wins: the stack's threads and rooms.
WHERE = (
    ("SQLite thread: commit", ("_connection_worker_thread", "_transaction")),
    ("SQLite thread: other statements", ("_connection_worker_thread",)),
    ("loop: engine (claims, steps, commits)", ("Engine.",)),
    ("loop: runner and keepers", ("Runner.",)),
    ("loop: runner and keepers", ("keeper",)),
    ("loop: dispatcher", ("Dispatcher.",)),
    ("loop: memory and GPU samplers", ("watch/memory.py",)),
    ("loop: memory and GPU samplers", ("sampling.py",)),
    ("loop: memory and GPU samplers", ("gpu_monitor",)),
    ("loop: requests", ("requests/",)),
    ("deadman thread", ("deadman",)),
)


def shares(folded: Path) -> dict[str, float]:
    """The share (%) of samples by WHERE, the loop's own select, and the rest."""
    counts: collections.Counter[str] = collections.Counter()
    for line in folded.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        what = "other"
        if stack.rsplit(";", 1)[-1].startswith("EpollSelector.select"):
            what = "loop: epoll select (waiting, counted by py-spy)"
        else:
            what = next((name for name, marks in WHERE if all(m in stack for m in marks)), what)
        counts[what] += int(n)
    total = sum(counts.values()) or 1
    return {k: round(100 * v / total, 1) for k, v in counts.most_common()}


def measure(root: Path, jobs: int, dry_run: int, folded: Path, queued: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"load_1m": [round(os.getloadavg()[0], 2)]}
    spy_bin = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    with BenchDaemon(root / "prime") as primer:  # fills the bytecode cache, as installing does
        primer.start()
    with BenchDaemon(root / "d") as d:
        d.start()
        time.sleep(1.0)
        out["idle_rss_mb"] = d.rss_mb()
        spy = None
        if spy_bin is not None:
            argv = [spy_bin, "record", "--pid", str(d.process().pid), "--rate", "250"]
            argv += ["--nonblocking", "--format", "raw", "--output", str(folded)]
            spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached before the batch
        out["batch"] = measure_throughput(d, jobs, gpus=1)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
            out["profile_shares_pct"] = shares(folded) if folded.exists() else {}
        out["rss_after_jobs_mb"] = d.rss_mb()
        began = time.perf_counter()
        reply = d.call(submit_request(d.root, [["true"]] * dry_run, dry_run=True))
        out["dry_run"] = {"jobs": dry_run, "ok": reply.get("ok")}
        out["dry_run"]["s"] = round(time.perf_counter() - began, 2)
        out["rss_after_dry_run_mb"] = d.rss_mb()
        time.sleep(5.0)
        out["rss_5s_after_dry_run_mb"] = d.rss_mb()
    if queued:
        out["queued"] = measure_queued(root / "q", queued, dry_run)
    out["load_1m"].append(round(os.getloadavg()[0], 2))
    return out


def measure_queued(root: Path, jobs: int, dry_run: int) -> dict[str, Any]:
    """RSS of a fresh, paused daemon: idle, after a dry run of `dry_run` jobs, and after a
    real batch of `jobs` is queued."""
    out: dict[str, Any] = {"jobs": jobs}
    with BenchDaemon(root, config=f"max_queued_per_user = {jobs}\n") as d:
        d.start()
        assert d.call({"type": "pause"})["ok"]  # none starts: what stays is the queue
        time.sleep(1.0)
        out["idle_rss_mb"] = d.rss_mb()
        if dry_run:
            assert d.call(submit_request(d.root, [["true"]] * dry_run, dry_run=True))["ok"]
            out["rss_after_dry_run_mb"] = d.rss_mb()
            time.sleep(5.0)
            out["rss_5s_after_dry_run_mb"] = d.rss_mb()
        began = time.perf_counter()
        reply = d.call(submit_request(d.root, [["true"]] * jobs))
        out["s"] = round(time.perf_counter() - began, 2)
        out["ok"] = reply.get("ok")
        out["rss_queued_mb"] = d.rss_mb()
        time.sleep(5.0)
        out["rss_5s_after_mb"] = d.rss_mb()
        grown = out["rss_5s_after_mb"] - out["idle_rss_mb"]
        out["kib_per_queued_job"] = round(grown * 1024 / jobs, 2)
    return out


def measure_run(root: Path, jobs: int) -> dict[str, Any]:
    """RSS of a fresh daemon that runs a batch of `jobs` trivial jobs (one `submit_batch`,
    one card each) to its end: idle, once they are queued, at the end, 5 s and 35 s later
    (it trims its heap once idle)."""
    out: dict[str, Any] = {"jobs": jobs}
    with BenchDaemon(root, config=f"max_queued_per_user = {jobs}\n") as d:
        d.start()
        time.sleep(1.0)
        out["idle_rss_mb"] = d.rss_mb()
        began = time.perf_counter()
        assert d.call(submit_request(d.root, [["true"]] * jobs, gpus=1))["ok"]
        out["queued_s"] = round(time.perf_counter() - began, 1)
        out["rss_queued_mb"] = d.rss_mb()
        active = {"type": "list", "states": ["queued", "running"], "limit": 1}
        while d.call(active).get("jobs"):
            time.sleep(1.0)
        out["ended_s"] = round(time.perf_counter() - began, 1)
        out["rss_ended_mb"] = d.rss_mb()
        time.sleep(5.0)
        out["rss_5s_after_mb"] = d.rss_mb()
        time.sleep(30.0)
        out["rss_35s_after_mb"] = d.rss_mb()
        out["over_idle_mb"] = round(out["rss_35s_after_mb"] - out["idle_rss_mb"], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("--jobs", type=int, default=1000, help="trivial jobs in the sampled batch")
    p.add_argument("--dry-run", dest="dry_run", type=int, default=100_000, help="jobs")
    p.add_argument("--queued", type=int, default=100_000, help="jobs queued (0: none)")
    p.add_argument(
        "--run", type=int, default=0, help="jobs of a batch run to its end, RSS after (0: none)"
    )
    p.add_argument("--out", type=Path, default=Path("bench/results/profile.json"))
    a = p.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    folded = a.out.with_name("daemon.folded")
    with tempfile.TemporaryDirectory(prefix="gpusv-profile-") as tmp:
        r = measure(Path(tmp), a.jobs, a.dry_run, folded, a.queued)
        if a.run:
            r["run"] = measure_run(Path(tmp) / "run", a.run)
    print(json.dumps(r, indent=1))
    a.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
