"""What a user's own gpusvd misses against root's: the peak its sampler sees of a short
spike beside the job cgroup's high-water mark, and which escapes its tree fallback finds.

    sudo .venv/bin/python -m bench.unprivileged [--trials 10] [--spikes 50,100,200,500,1000]

Needs root, to make the memory cgroups that stand for root's view. The sampler is the
daemon's own (TreeSampler, at the default sample_interval_s); the fallback is the
keeper's (the leader's tree, its process group, and tagged orphans of a subreaper).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

from supervisor.daemon.cgroups import memory_peak_mb
from supervisor.daemon.config import HostMemoryConfig
from supervisor.daemon.watch.memory import TreeSampler
from supervisor.keeper.__main__ import become_subreaper
from supervisor.keeper.cgroup import orphan_pids, tree_pids

SPIKE_MB = 200
# Waits a random part of one interval (the sampler's phase is anyone's), touches
# SPIKE_MB (printing how long touching took: the rise before the spike), holds it for
# the spike, frees it and idles on.
SPIKE = (
    "import sys, time; time.sleep(float(sys.argv[2])); t = time.monotonic()\n"
    f"b = bytearray({SPIKE_MB} << 20); b[::4096] = b'x' * len(b[::4096])\n"
    "print(round((time.monotonic() - t) * 1000), flush=True)\n"
    "time.sleep(float(sys.argv[1]) / 1000); del b; time.sleep(0.6)"
)


def memory_cgroup() -> Path:
    """A fresh memory cgroup (v2 with the memory controller, else v1)."""
    v2 = Path("/sys/fs/cgroup")
    name = f"gpusv-bench-{uuid.uuid4().hex[:8]}"
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        path = v2 / name
    elif (Path("/sys/fs/cgroup/memory") / "memory.limit_in_bytes").exists():
        path = Path("/sys/fs/cgroup/memory") / name
    else:
        raise SystemExit("no memory cgroup controller (v1 or v2) to compare against")
    path.mkdir()
    return path


def _join(cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text("0")


def one_spike(spike_ms: int, interval_s: float) -> tuple[int, int, int]:
    """(the sampler's peak, the cgroup's high-water mark) in MiB, and the rise in ms."""
    cgroup = memory_cgroup()
    try:
        phase = random.uniform(0, interval_s)
        argv = [sys.executable, "-c", SPIKE, str(spike_ms), str(phase)]
        child = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: _join(cgroup)
        )
        sampler, sampled = TreeSampler(), 0
        while child.poll() is None:  # the daemon's loop: sleep an interval, then a pass
            time.sleep(interval_s)
            seen = sampler.sample({1: child.pid}).get(1)
            sampled = max(sampled, seen.rss_mb if seen else 0)
        kernel = memory_peak_mb(cgroup) or 0
        assert child.stdout is not None
        return sampled, kernel, int(child.stdout.read() or 0)
    finally:
        cgroup.rmdir()


def peaks(spikes: list[int], trials: int, interval_s: float) -> list[dict[str, Any]]:
    rows = []
    for spike_ms in spikes:
        runs = [one_spike(spike_ms, interval_s) for _ in range(trials)]
        caught = sum(1 for s, k, _ in runs if s >= k - SPIKE_MB // 2)
        rows.append(
            {
                "spike_ms": spike_ms,
                "trials": trials,
                "caught": caught,
                "sampled_median_mb": median(s for s, _, _ in runs),
                "cgroup_median_mb": median(k for _, k, _ in runs),
                "sampled_over_cgroup_median": round(median(s / k for s, k, _ in runs if k), 2),
                "rise_median_ms": median(r for _, _, r in runs),
            }
        )
    return rows


# Each shape writes the pid of the process that tries to get away to $PIDFILE.
ESCAPES = {
    "child": "sleep 1000 & echo $! > $PIDFILE; wait",
    "setsid child, leader alive": "setsid sleep 1000 & echo $! > $PIDFILE; wait",
    "setsid child, leader exited": "setsid sleep 1000 & echo $! > $PIDFILE",
    "double fork + setsid": "(setsid sh -c 'echo $$ > $PIDFILE; exec sleep 1000' &); sleep 1000",
    "double fork + setsid + env -i": (
        "(env -i PIDFILE=$PIDFILE setsid sh -c 'echo $$ > $PIDFILE; exec sleep 1000' &); sleep 1000"
    ),
}


def one_escape(script: str, pidfile: Path) -> dict[str, bool]:
    """Whether the cgroup, and whether the fallback, finds the escapee (1 = job 1 attempt 1)."""
    cgroup = memory_cgroup()
    env = {**os.environ, "GPUSV_JOB_ID": "1", "GPUSV_ATTEMPT": "1", "PIDFILE": str(pidfile)}
    leader = subprocess.Popen(
        ["sh", "-c", script], env=env, start_new_session=True, preexec_fn=lambda: _join(cgroup)
    )
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()):
            if time.monotonic() > deadline:
                raise SystemExit(f"no escapee from {script!r}")
            time.sleep(0.01)
        time.sleep(0.1)  # the leader's exit, where it exits, and the re-parenting
        pid = int(pidfile.read_text())
        alive = leader.poll() is None
        fallback = set(orphan_pids(os.getpid(), 1, 1))
        if alive:
            fallback |= set(tree_pids(leader.pid))
            with contextlib.suppress(OSError):
                fallback |= {pid} if os.getpgid(pid) == leader.pid else set()
        in_cgroup = pid in {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
        return {"cgroup": in_cgroup, "fallback": pid in fallback}
    finally:
        for p in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p), signal.SIGKILL)
        leader.wait()
        while (cgroup / "cgroup.procs").read_text().strip():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(-1, os.WNOHANG)
            time.sleep(0.01)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        cgroup.rmdir()
        pidfile.unlink(missing_ok=True)


def escapes() -> dict[str, dict[str, bool]]:
    if not become_subreaper():
        raise SystemExit("cannot become a child subreaper, as a keeper does")
    with tempfile.TemporaryDirectory() as tmp:
        return {name: one_escape(s, Path(tmp) / "pid") for name, s in ESCAPES.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--spikes", default="50,100,200,500,1000", help="spike lengths, ms")
    ap.add_argument("--interval", type=float, default=HostMemoryConfig().sample_interval_s)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root, to make the memory cgroups that stand for root's view")
    rows = peaks([int(s) for s in a.spikes.split(",")], a.trials, a.interval)
    found = escapes()
    if a.json:
        print(json.dumps({"interval_s": a.interval, "peaks": rows, "escapes": found}, indent=1))
        return 0
    print(f"a {SPIKE_MB} MiB spike sampled every {a.interval:g} s, against the cgroup's peak")
    print("(caught: the sampled peak within half the spike of the cgroup's)")
    print("spike_ms  caught/trials  sampled_median_MiB  cgroup_median_MiB  sampled/cgroup  rise_ms")
    for r in rows:
        print(
            f"{r['spike_ms']:>8}  {r['caught']:>6}/{r['trials']:<6}  "
            f"{r['sampled_median_mb']:>18}  {r['cgroup_median_mb']:>17}  "
            f"{r['sampled_over_cgroup_median']:>14}  {r['rise_median_ms']:>7}"
        )
    print("\nescape                          cgroup  fallback")
    for name, seen in found.items():
        print(f"{name:<30}  {seen['cgroup']!s:>6}  {seen['fallback']!s:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
