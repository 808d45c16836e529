"""Revisions side by side: `python -m bench.compare REV REV... [--pairs 3] [--jobs 2000]
[--gpus 0] [--latency N] [--python PYTHON]` (`.` is the working tree as it is, uncommitted
changes included).

Each revision is checked out as a git worktree in a temporary directory, and the runs
take turns (A, B, A, B, ...), each on a fresh daemon that imports its own tree, so that
this machine's drift of 10-20 % between minutes falls on all of them alike. Per run:
the daemon's and its keepers' CPU per trivial job, jobs/s and the machine's CPU per job
(with `--latency N`: N lone jobs one after another instead, from the submit request to
the job's first instruction); then each revision's median. (`python -m
supervisor.daemon.life.app` puts its working directory first on sys.path: the daemons run
in their own directory, which holds no `supervisor`.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .harness import PY, REPO, BenchDaemon, gpusv_env
from .jobs import measure_latency, measure_throughput

WARMUP_JOBS = 300  # first: the kind learnt as short, prometheus_client imported, as in use


def _trees(revs: list[str], scratch: Path) -> dict[str, Path]:
    trees = {}
    for i, rev in enumerate(revs):
        if rev == ".":
            trees[rev] = REPO
            continue
        tree = scratch / f"tree-{i}"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev],
            check=True,
        )
        trees[rev] = tree
    return trees


def _imports_from(tree: Path, cwd: Path, python: Path | None) -> str:
    code = "import supervisor; print(supervisor.__file__)"
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    argv = [str(python or PY), "-c", code]
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    return done.stdout.strip()


def _run(
    tree: Path, args: argparse.Namespace, scratch: Path, python: Path | None
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    config = "" if args.gpus else "cpu_slots = 2\n"
    with BenchDaemon(root, config=config, python=python) as d:
        d.env["PYTHONPATH"] = str(tree)
        d.cwd = root
        d.start()
        if args.warmup:  # none: a fresh daemon's first jobs are measured too
            measure_throughput(d, args.warmup, gpus=args.gpus)
        if args.latency:
            return measure_latency(d, args.latency)
        keepers = d.keepers_cpu_s()
        m = measure_throughput(d, args.jobs, gpus=args.gpus)
        m["keeper_cpu_ms_per_job"] = 1000 * (d.keepers_cpu_s() - keepers) / args.jobs
        return m


def _line(m: dict[str, Any]) -> str:
    if "socket_submit_to_start_ms" in m:
        return (
            f"submit request -> start p50 {m['socket_submit_to_start_ms']['p50']:.2f} ms "
            f"(the job's own start {m['job_spawn_floor_ms']['p50']:.2f} ms)"
        )
    per_job = 1000 * m["machine_cpu_s"] / m["jobs"]
    return (
        f"daemon {m['daemon_cpu_ms_per_job']:.3f} ms/job, "
        f"keepers {m['keeper_cpu_ms_per_job']:.3f} ms/job, {m['jobs_per_s']:.0f} jobs/s, "
        f"machine {per_job:.2f} ms/job"
    )


def _median(ms: list[dict[str, Any]]) -> str:
    if "socket_submit_to_start_ms" in ms[0]:
        p50 = statistics.median(m["socket_submit_to_start_ms"]["p50"] for m in ms)
        return f"submit request -> start p50 {p50:.2f} ms"
    cpu = statistics.median(m["daemon_cpu_ms_per_job"] for m in ms)
    keepers = statistics.median(m["keeper_cpu_ms_per_job"] for m in ms)
    rate = statistics.median(m["jobs_per_s"] for m in ms)
    machine = statistics.median(1000 * m["machine_cpu_s"] / m["jobs"] for m in ms)
    return (
        f"daemon {cpu:.3f} ms/job, keepers {keepers:.3f} ms/job, {rate:.0f} jobs/s, "
        f"machine {machine:.2f} ms/job"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    ap.add_argument("revs", nargs="+", help="git revisions; `.` is the working tree")
    ap.add_argument("--pairs", type=int, default=3, help="runs of each revision, in turn")
    ap.add_argument("--jobs", type=int, default=2000, help="trivial jobs per run")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs per job (0: CPU slots)")
    ap.add_argument("--warmup", type=int, default=WARMUP_JOBS, help="jobs run first, unmeasured")
    ap.add_argument(
        "--latency", type=int, default=0, metavar="N", help="instead: N lone jobs, submit -> start"
    )
    ap.add_argument(
        "--python",
        type=Path,
        metavar="PYTHON",
        help="run the daemons, their keepers and the CLI from an environment made with this "
        "python3 (as bench.peers --gpusv-python makes it); each revision's code still comes "
        "from its own tree",
    )
    args = ap.parse_args(argv)
    python = None  # the daemons' interpreter: the bench's own, or one of an environment made
    if args.python is not None:
        if not args.python.exists():
            ap.error(f"--python {args.python}: no such file")
        try:
            python = gpusv_env(args.python)
        except (OSError, subprocess.CalledProcessError) as e:
            ap.error(f"--python {args.python}: no environment could be made with it: {e}")
    with tempfile.TemporaryDirectory(prefix="gpusv-compare-", dir="/tmp") as tmp:
        scratch = Path(tmp)
        trees = _trees(args.revs, scratch)
        try:
            for rev, tree in trees.items():
                print(f"{rev}: {_imports_from(tree, scratch, python)}", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {rev: [] for rev in trees}
            for i in range(args.pairs):
                for rev, tree in trees.items():
                    runs[rev].append(_run(tree, args, scratch, python))
                    print(f"run {i + 1} {rev}: {_line(runs[rev][-1])}", flush=True)
            for rev, ms in runs.items():
                print(f"median {rev}: {_median(ms)}")
        finally:
            for tree in trees.values():
                if tree != REPO:
                    subprocess.run(
                        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                        check=False,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
