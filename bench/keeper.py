"""Keepers alone, beside Task Spooler: `python -m bench.keeper [--jobs N] [--slots S]`.

Measures what the execution layer costs without the daemon in front of it: one spawn
answered (fork, output files opened, start record written, gate, exec), jobs/s of N
trivial jobs kept S at a time through one keeper and through one keeper per slot pair,
each keeper's CPU per job and RSS, and what starting one Python interpreter costs (the
floor of a per-job shim written in Python). Job cgroups are made for real when running
as root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from supervisor.keeper.client import Connection, launch

from .harness import machine_cpu_s, summary
from .tsp import measure_tsp

UNIFIED = Path("/sys/fs/cgroup/unified")
MEMCG = Path("/sys/fs/cgroup/memory")
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _roots(tag: str) -> tuple[Path | None, Path | None]:
    if os.geteuid() != 0:
        return None, None
    v2 = UNIFIED / tag if (UNIFIED / "cgroup.procs").exists() else None
    v1 = MEMCG / tag if (MEMCG / "memory.limit_in_bytes").exists() else None
    return v2, v1


ARGV = ["true"]  # each job's command (--command): what its output costs the keeper


def _job(home: Path, job: int) -> dict[str, Any]:
    out = str(home / f"{job}.out")
    return {
        "job": job,
        "attempt": 1,
        "argv": ARGV,
        "cwd": "/",
        "stdout": out,
        "stderr": out,
        "env": {"PATH": "/usr/bin:/bin"},
        "oom_score_adj": 0,
    }


class Keepers:
    """`n` keepers, each with its own cgroup roots, attached and multiplexed."""

    def __init__(self, root: Path, n: int) -> None:
        self.tag = f"gpusv-bench-{uuid.uuid4().hex[:8]}"
        self.homes = [root / f"keeper{i}" for i in range(n)]
        self.cgroups = [_roots(f"{self.tag}-{i}") for i in range(n)]
        for home, (v2, v1) in zip(self.homes, self.cgroups, strict=True):
            launch(home, v2, v1)
        self.conns = [Connection(home / "sock") for home in self.homes]
        self.pids = [int(conn.call("attach")["pid"]) for conn in self.conns]

    def cpu_s(self) -> float:
        return sum(_cpu_s(pid) for pid in self.pids)

    def close(self) -> None:
        for conn in self.conns:
            conn.call("shutdown")
            conn.close()
        for v2, v1 in self.cgroups:  # a keeper let go removes its own, maybe first
            for path in (v2, v1):
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        path.rmdir()


def spawn_latency(k: Keepers, runs: int) -> dict[str, float]:
    """One spawn at a time: request sent -> answered (the command exec'd)."""
    conn, walls = k.conns[0], []
    for job in range(runs):
        began = time.perf_counter()
        conn.call("spawn", **_job(k.homes[0], 10_000_000 + job))
        walls.append(time.perf_counter() - began)
        while conn.event()["event"] != "exit":
            pass
        conn.call("ack", job=10_000_000 + job, attempt=1)
    return summary(walls)


def throughput(k: Keepers, jobs: int, slots: int) -> dict[str, Any]:
    """`jobs` trivial jobs, `slots` at a time; a slot's next job is sent on its exit."""
    sel = selectors.DefaultSelector()
    inbox = {i: b"" for i in range(len(k.conns))}
    for i, conn in enumerate(k.conns):
        sel.register(conn.sock, selectors.EVENT_READ, i)
    sent = done = 0

    def start(i: int) -> None:
        nonlocal sent
        sent += 1
        k.conns[i].send("spawn", **_job(k.homes[i], sent))

    cpu0, machine0, began = k.cpu_s(), machine_cpu_s(), time.perf_counter()
    for slot in range(min(slots, jobs)):
        start(slot % len(k.conns))
    while done < jobs:
        for key, _ in sel.select():
            i = key.data
            inbox[i] += k.conns[i].sock.recv(1 << 16)
            *lines, inbox[i] = inbox[i].split(b"\n")
            for line in lines:
                message = json.loads(line)
                if message.get("event") == "exit":
                    done += 1
                    k.conns[i].send("ack", job=message["job"]["job"], attempt=1)
                    if sent < jobs:
                        start(i)
                elif not message.get("ok"):
                    raise RuntimeError(f"keeper refused: {message}")
    wall = time.perf_counter() - began
    cpu, machine = k.cpu_s() - cpu0, machine_cpu_s() - machine0
    for conn in k.conns:
        conn.call("ping")  # the acks are answered by now: the journal is short again
    return {
        "jobs": jobs,
        "slots": slots,
        "keepers": len(k.conns),
        "wall_s": round(wall, 3),
        "jobs_per_s": round(jobs / wall, 1),
        "keeper_cpu_ms_per_job": round(1000 * cpu / jobs, 3),
        "machine_cpu_ms_per_job": round(1000 * machine / jobs, 3),
        "keeper_rss_mb": [_rss_mb(pid) for pid in k.pids],
    }


def python_start_cpu_ms(runs: int = 10) -> float:
    """CPU of one interpreter that imports the keeper: what a per-job shim would pay."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        subprocess.run([sys.executable, "-c", "import supervisor.keeper.server"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return round(1000 * used / runs, 2)


def measure(root: Path, jobs: int, slots: int, with_tsp: bool = True) -> dict[str, Any]:
    r: dict[str, Any] = {"python_start_cpu_ms": python_start_cpu_ms()}
    one = Keepers(root / "one", 1)
    try:
        r["idle_rss_mb"] = _rss_mb(one.pids[0])
        r["cgroups"] = {"unified": str(one.cgroups[0][0]), "memcg": str(one.cgroups[0][1])}
        r["spawn_latency_ms"] = spawn_latency(one, min(200, jobs))
        r["one_keeper"] = throughput(one, jobs, slots)
    finally:
        one.close()
    several = Keepers(root / "several", slots)
    try:
        r["keeper_per_slot"] = throughput(several, jobs, slots)
    finally:
        several.close()
    if with_tsp:
        r["tsp"] = measure_tsp(root / "tsp", jobs, slots)
        if "jobs_per_s" in r["tsp"]:
            r["ratio_vs_tsp"] = round(r["one_keeper"]["jobs_per_s"] / r["tsp"]["jobs_per_s"], 2)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.keeper", description=__doc__)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--no-tsp", action="store_true")
    p.add_argument(
        "--command",
        default="true",
        help="each job's command, split as a shell would (e.g. 'head -c 65536 /dev/zero')",
    )
    a = p.parse_args(argv)
    ARGV[:] = shlex.split(a.command)
    root = Path(tempfile.mkdtemp(prefix="gpusv-keeper-bench-"))
    socket_path_room = 107 - len(str(root / "several" / "keeper0" / "sock"))
    assert socket_path_room > 0, "temporary directory path too long for a socket"
    try:
        results = measure(root, a.jobs, a.slots, not a.no_tsp)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
