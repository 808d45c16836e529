"""Runs inside the benchmark's own environment (`.bench-venv`, with PyPI's `hyperqueue`),
never gpusv's: N trivial jobs as one HyperQueue job on a local cluster (its Rust server and
one worker of CORES cores, started by `hyperqueue.cluster.LocalCluster`). Prints one JSON
object. Usage: python bench/hq_jobs.py N CORES DIR (made here, left for the caller to remove:
deleting thousands of files would slow the next system's file creation, see bench.peers)

HyperQueue's client learns that a job ended by asking its server once a second, so the
time `wait_for_jobs` returns is rounded up to the next whole second after the start. The
end is taken instead from the tasks' own output files: the last one created is the last
task's start, which makes the figure HyperQueue's by that one task's run (about 1 ms of
`true`) and never against it. The polled time is reported beside it.
"""

import json
import os
import sys
import time
from pathlib import Path


def _machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    ticks = sum(int(x) for x in fields[:3]) + sum(int(x) for x in fields[5:8])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    from hyperqueue import Job, LocalCluster
    from hyperqueue.cluster import WorkerConfig

    jobs, cores, tmp = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    tmp.mkdir(parents=True)
    with LocalCluster(server_dir=str(tmp / "server")) as cluster:
        cluster.start_worker(WorkerConfig(cores=cores))
        client = cluster.client()
        job = Job(default_workdir=tmp)
        for _ in range(jobs):
            job.program(["true"])  # stdout and stderr to files, as gpusv's jobs
        machine0, began = _machine_cpu_s(), time.time()
        submitted = client.submit(job)
        client.wait_for_jobs([submitted])
        polled = time.time() - began
        machine = _machine_cpu_s() - machine0
        outputs = [p for p in tmp.rglob("*") if p.suffix in (".stdout", ".stderr")]
        if len(outputs) != 2 * jobs:
            raise SystemExit(f"expected {2 * jobs} output files, found {len(outputs)}")
        wall = max(p.stat().st_mtime for p in outputs) - began
    from importlib.metadata import version

    print(
        json.dumps(
            {
                "version": version("hyperqueue"),
                "jobs": jobs,
                "cores": cores,
                "wall_s": round(wall, 3),
                "wall_polled_s": round(polled, 3),
                "jobs_per_s": round(jobs / wall, 1),
                "machine_cpu_s": round(machine, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
