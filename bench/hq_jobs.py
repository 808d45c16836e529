"""Runs inside the benchmark's own environment (`.bench-venv`, with PyPI's `hyperqueue`),
never gpusv's: N trivial jobs as one HyperQueue job on a local cluster (its Rust server and
one worker of CORES cores, started by `hyperqueue.cluster.LocalCluster`). Prints one JSON
object. Usage: python bench/hq_jobs.py N CORES
"""

import json
import os
import sys
import tempfile
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

    jobs, cores = int(sys.argv[1]), int(sys.argv[2])
    with (
        tempfile.TemporaryDirectory(prefix="hq-") as tmp,
        LocalCluster(server_dir=str(Path(tmp) / "server")) as cluster,
    ):
        cluster.start_worker(WorkerConfig(cores=cores))
        client = cluster.client()
        job = Job(default_workdir=Path(tmp))
        for _ in range(jobs):
            job.program(["true"])  # stdout and stderr to files, as gpusv's jobs
        machine0, began = _machine_cpu_s(), time.perf_counter()
        submitted = client.submit(job)
        client.wait_for_jobs([submitted])
        wall = time.perf_counter() - began
        machine = _machine_cpu_s() - machine0
    from importlib.metadata import version

    print(
        json.dumps(
            {
                "version": version("hyperqueue"),
                "jobs": jobs,
                "cores": cores,
                "wall_s": round(wall, 3),
                "jobs_per_s": round(jobs / wall, 1),
                "machine_cpu_s": round(machine, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
