"""Jobs through a live daemon: submit -> start latency, throughput on trivial jobs, and
kernel line -> gpu_hang abort latency."""

from __future__ import annotations

import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

from supervisor.daemon.clock import epoch_from_iso

from .harness import (
    XID_109,
    BenchDaemon,
    machine_cpu_s,
    submit_request,
    summary,
    wait_until,
)

MARK = "date +%s.%N > {}"  # the job's first act: its own start time, cheaply
LAST_JOBS = 2  # a batch's last jobs: one a card (or CPU slot) of the bench's two


def _mark_time(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return float(text) if text else None


def _spawn_floor(marks: Path, runs: int) -> list[float]:
    """What the job's own `sh -c 'date ...'` costs to start, run straight from here."""
    out = []
    for i in range(runs):
        mark = marks / f"floor-{i}"
        sent = time.time()
        subprocess.run(["sh", "-c", MARK.format(mark)], check=True)
        out.append(wait_until(partial(_mark_time, mark), 10, "the mark") - sent)
    return out


def measure_latency(d: BenchDaemon, jobs: int) -> dict[str, Any]:
    """Sequential jobs on an idle card, to the job's first instruction: from the request
    sent on an open socket; from the CLI's exec; and from the moment the daemon took a
    CLI's request (its `submitted_at`), which leaves the CLI's own start-up out."""
    marks = d.root / "marks"
    marks.mkdir(exist_ok=True)
    socket_s, cli_s, over = [], [], []
    for i in range(jobs):
        mark = marks / f"sock-{i}"
        sent = time.time()
        ids = d.call(submit_request(d.root, [["sh", "-c", MARK.format(mark)]]))["ids"]
        socket_s.append(wait_until(partial(_mark_time, mark), 30, "the job") - sent)
        d.wait_jobs(ids)
    gpusv = str(d.bin / "gpusv")
    for i in range(jobs):
        mark = marks / f"cli-{i}"
        sent = time.time()
        done = subprocess.run(
            [gpusv, "submit", "--", "sh", "-c", MARK.format(mark)],
            env=d.env,
            cwd=d.root,
            capture_output=True,
            text=True,
            check=True,
        )
        started = wait_until(partial(_mark_time, mark), 30, "the job")
        (job,) = d.wait_jobs([int(done.stdout)])
        cli_s.append(started - sent)
        over.append(started - epoch_from_iso(job["submitted_at"]))
    return {
        "jobs": jobs,
        "socket_submit_to_start_ms": summary(socket_s),
        "cli_submit_to_start_ms": summary(cli_s),
        "over_cli_ms": summary(over),
        "job_spawn_floor_ms": summary(_spawn_floor(marks, min(jobs, 20))),
    }


def measure_throughput(d: BenchDaemon, jobs: int, gpus: int) -> dict[str, Any]:
    """`jobs` x `true` submitted in one `gpusv submit --batch -`; from the start of the
    `gpusv` command to the last job's end as the daemon recorded it (its `ended_at`: the
    keeper's reaping), and the daemon's and the machine's CPU seconds until a `wait` for
    the batch's last LAST_JOBS jobs returned (`wall_waited_s`), as Task Spooler's are
    taken (bench/tsp.py): each card runs its jobs in queue order, so the last ones are
    the last to end. Every job is waited for and checked after that; a `wait` of all of
    them during the batch would charge the daemon an answer a job that no peer gives."""
    cpu0, machine0 = d.cpu_s(), machine_cpu_s()
    began_wall = time.time()
    began = time.perf_counter()
    done = subprocess.run(
        [str(d.bin / "gpusv"), "submit", "--gpus", str(gpus), "--batch", "-"],
        input="true\n" * jobs,
        env=d.env,
        cwd=d.root,
        capture_output=True,
        text=True,
        check=True,
    )
    submitted = time.perf_counter() - began
    ids = [int(line) for line in done.stdout.split()]
    assert len(ids) == jobs, f"expected {jobs} ids, got {len(ids)}"
    d.wait_jobs(ids[-LAST_JOBS:])
    waited = time.perf_counter() - began
    cpu, machine = d.cpu_s() - cpu0, machine_cpu_s() - machine0
    finished = d.wait_jobs(ids)
    failed = [j["id"] for j in finished if j["state"] != "succeeded"]
    assert not failed, f"jobs did not succeed: {failed[:10]}"
    wall = max(epoch_from_iso(j["ended_at"]) for j in finished) - began_wall
    return {
        "jobs": jobs,
        "gpus_per_job": gpus,
        "submit_s": round(submitted, 3),
        "wall_s": round(wall, 3),
        "wall_waited_s": round(waited, 3),
        "jobs_per_s": round(jobs / wall, 1),
        "daemon_cpu_s": round(cpu, 3),
        "daemon_cpu_ms_per_job": round(1000 * cpu / jobs, 3),
        "machine_cpu_s": round(machine, 3),
    }


def measure_handover(d: BenchDaemon, jobs: int, run_s: float, slots: int) -> dict[str, Any]:
    """`jobs` x `sleep run_s` on `slots` CPU slots in one batch: the wall time beyond the
    jobs' own (run_s each, `slots` at a time), per job and slot. What a slot stays idle
    between one job's exit and the next one's start, its own exec included."""
    began = time.perf_counter()
    done = subprocess.run(
        [str(d.bin / "gpusv"), "submit", "--gpus", "0", "--batch", "-"],
        input=f"sleep {run_s}\n" * jobs,
        env=d.env,
        cwd=d.root,
        capture_output=True,
        text=True,
        check=True,
    )
    finished = d.wait_jobs([int(line) for line in done.stdout.split()])
    wall = time.perf_counter() - began
    assert all(j["state"] == "succeeded" for j in finished), "a sleep did not succeed"
    per_slot = jobs / slots
    return {
        "jobs": jobs,
        "run_s": run_s,
        "cpu_slots": slots,
        "wall_s": round(wall, 3),
        "idle_per_job_ms": round(1000 * (wall - per_slot * run_s) / per_slot, 2),
    }


def _hung(d: BenchDaemon, job: int) -> bool:
    attempts = d.call({"type": "show", "ids": [job]})["job"]["attempts"]
    return bool(attempts) and attempts[0]["reason"] == "gpu_hang"


def measure_hang(d: BenchDaemon, repeats: int) -> dict[str, Any]:
    """An Xid 109 line for the job's card appended to the kernel log while it runs; until
    `show` reports the attempt ended as gpu_hang (polled every 2 ms)."""
    out = []
    for i in range(repeats):
        mark = d.root / f"hang-{i}"
        request = submit_request(d.root, [["sh", "-c", f"echo x > {mark}; exec sleep 600"]])
        (job,) = d.call({**request, "retries": 0, "gpu_hang_retries": 0})["ids"]
        wait_until(mark.exists, 30, "the job to start", poll=0.01)
        (card,) = d.call({"type": "show", "ids": [job]})["job"]["gpus"]
        with open(d.kernel_log, "a") as log:
            appended = time.perf_counter()
            log.write(XID_109.format(bus=card + 1) + "\n")

        wait_until(partial(_hung, d, job), 30, "the gpu_hang")
        out.append(time.perf_counter() - appended)
        d.wait_jobs([job])
    return {"repeats": repeats, "line_to_gpu_hang_ms": summary(out)}
