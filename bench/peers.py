"""gpusv beside its peers, in one run: `python -m bench.peers [--jobs 1000] [--rounds 2]`.

The same N trivial jobs (`true`) on the same machine, two at a time, each system's span
from its submit's start to its last job's end as it records or shows it:
- gpusv: one `gpusv submit --batch -` on 2 simulated cards, one job per card, durability
  (SQLite, synchronous=FULL) and per-job output files on, as a user runs it; from the
  `gpusv` command's start to the last job's recorded end (`ended_at`: its keeper's reaping);
- Task Spooler: its CLI loop (`tsp true` per job, `tsp -S 2`), as its users run it; from
  the first `tsp true` to the return of `tsp -w` on the last two jobs (every job is
  checked after);
- HyperQueue: the PyPI package `hyperqueue` in the benchmark's own environment
  (`.bench-venv`, made here on first use, never a dependency of gpusv), its Rust server and
  one 2-core worker started by `LocalCluster`, the N jobs as one job of N tasks; from
  `client.submit` in a client already running to the last task's start (hq_jobs.py);
- the floor: N `true` started by posix_spawn from one Python process, two at a time,
  with nothing recorded: what fork/exec alone allows here.
The systems take turns round by round, so the machine's drift falls on all alike; each
figure is the median of the rounds. Prints one table with each system's jobs/s, its
ratio to the best peer, and CPU per job (the whole machine's, and for gpusv the daemon's
and its keepers'); writes the figures as JSON.

Every system creates a file or two a job (gpusv its output, Task Spooler its output,
HyperQueue a stdout and a stderr), and on an ext4 without a journal each new file scans
past every inode of its block group freed in the last minute or more: after a few
thousand deletions a creation costs ten times what it costs on a quiet file system. So no
system's files are deleted until the run ends (HyperQueue's included), and before each
round the cost of creating an empty file is measured (`file_create_us`) and reported, to
say what the machine was like. With `--settle S` the run first waits, up to S seconds,
for that cost to fall under QUIET_CREATE_US (the deletions of a test run age out in a
few minutes), so that figures of different runs compare. Each system's share of CPU
time stolen by the hypervisor during its round (`steal_pct`) is reported beside it: on a
shared VM a spell of steal slows whatever runs in it. And before each round a fixed loop
of plain Python is timed (`python_ms`), with the CPU's model in the machine's figures:
the same VM may be given a host whose cores run Python at half the speed of another's,
and gpusv, written in Python, moves with that more than its peers do.

The interpreter moves it too: a CPython built with PGO and LTO, its eval loop linked
into the executable (Debian's, Fedora's), runs gpusv's Python faster than one built by
default (`./configure` as pyenv runs it: no PGO, no LTO, the eval loop in a shared
libpython). Each gpusv row says which interpreter it ran on (`python`: the executable,
its version, whether libpython is a shared library, and the same timed loop run in it),
and with `--gpusv-python PYTHON` (repeatable) gpusv also runs, in every round, from an
environment made with that interpreter (`.bench-gpusv/<name>`, gpusv installed in it
from this checkout, made on first use), as an operator installs it with another
`python3 -m venv`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import REPO, BenchDaemon, cpu_shares, gpusv_env, machine_cpu_s, steal_pct
from .jobs import measure_throughput
from .tsp import measure_tsp

BENCH_VENV = REPO / ".bench-venv"
HQ_SCRIPT = Path(__file__).with_name("hq_jobs.py")
SLOTS = 2
QUIET_CREATE_US = 100.0  # an empty file's creation on a quiet file system: ~20-50 µs here


def bench_python() -> Path:
    """The benchmark's own environment, with HyperQueue from PyPI; made once."""
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    probe = subprocess.run([str(python), "-c", "import hyperqueue"], capture_output=True)
    if probe.returncode != 0:
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "hyperqueue"], check=True)
    return python


_FACTS = """
import json, sys, time
maps = open("/proc/self/maps").read()
best = float("inf")
for _ in range(3):
    began = time.process_time()
    sum(range(1_000_000))
    best = min(best, time.process_time() - began)
print(json.dumps({
    "executable": sys.executable,
    "version": sys.version.split()[0],
    "libpython_shared": "libpython" in maps,
    "loop_ms": round(1000 * best, 1),
}))
"""


def interpreter(python: Path) -> dict[str, Any]:
    """What a gpusv row ran on: the executable (links followed), its version, whether
    its eval loop is in a shared libpython, and python_ms's loop timed in it."""
    done = subprocess.run([str(python), "-c", _FACTS], capture_output=True, text=True)
    if done.returncode != 0:
        return {"executable": str(python), "error": done.stderr.strip()[-200:]}
    facts: dict[str, Any] = json.loads(done.stdout)
    facts["executable"] = str(Path(facts["executable"]).resolve())
    return facts


def measure_hyperqueue(root: Path, jobs: int) -> dict[str, Any]:
    try:
        python = bench_python()
    except (OSError, subprocess.CalledProcessError) as e:
        return {"skipped": f"hyperqueue could not be installed in {BENCH_VENV}: {e}"}
    done = subprocess.run(
        [str(python), str(HQ_SCRIPT), str(jobs), str(SLOTS), str(root)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"skipped": f"hyperqueue run failed: {done.stderr.strip()[-300:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def describe(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return f"{facts['executable']} (not described: {facts['error']})"
    shared = facts["libpython_shared"]
    how = "its eval loop in a shared libpython" if shared else "libpython linked in"
    return f"{facts['executable']} {facts['version']}, {how}, the loop {facts['loop_ms']} ms"


def file_create_us(root: Path, files: int = 200) -> float:
    """CPU µs to create one empty file in a new directory under `root` (its parent's block
    group, as the systems' files are made)."""
    probe = root / f"probe-{time.monotonic_ns()}"
    probe.mkdir(parents=True)
    began = time.process_time()
    for i in range(files):
        os.close(os.open(probe / str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return round(1e6 * (time.process_time() - began) / files, 1)


def python_ms(n: int = 1_000_000) -> float:
    """CPU ms of a fixed loop of plain Python (the sum of range(n)), the best of three."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        sum(range(n))
        best = min(best, time.process_time() - began)
    return round(1000 * best, 1)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return "unknown"


def _settle(root: Path, limit_s: float) -> float:
    """Wait, up to `limit_s`, until an empty file's creation is quick; the seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        cost = file_create_us(root)
        if cost < QUIET_CREATE_US:
            break
        sys.stderr.write(f"peers: an empty file's creation costs {cost} µs; waiting\n")
        time.sleep(15)
    return round(time.monotonic() - began, 1)


def measure_floor(jobs: int) -> dict[str, Any]:
    """posix_spawn and wait, SLOTS at a time: the start of a process and nothing else."""
    true = shutil.which("true") or "/bin/true"
    machine0, began = machine_cpu_s(), time.perf_counter()
    running: set[int] = set()
    for _ in range(jobs):
        if len(running) == SLOTS:
            pid, _status = os.wait()
            running.discard(pid)
        running.add(os.posix_spawn(true, [true], os.environ))
    while running:
        pid, _status = os.wait()
        running.discard(pid)
    wall = time.perf_counter() - began
    return {
        "jobs": jobs,
        "wall_s": round(wall, 3),
        "jobs_per_s": round(jobs / wall, 1),
        "machine_cpu_s": round(machine_cpu_s() - machine0, 3),
    }


def measure_gpusv(root: Path, jobs: int, python: Path | None = None) -> dict[str, Any]:
    with BenchDaemon(root, gpus=f"{SLOTS}x24G", python=python) as d:
        d.start()
        measure_throughput(d, min(jobs, 100), gpus=1)  # keepers up, first imports done
        keepers0 = d.keepers_cpu_s()
        result = measure_throughput(d, jobs, gpus=1)
        keepers = d.keepers_cpu_s() - keepers0
    result["keeper_cpu_ms_per_job"] = round(1000 * keepers / jobs, 3)
    return result


SYSTEMS = ("gpusv", "tsp", "hyperqueue", "floor")
PEERS = ("tsp", "hyperqueue")


def _once(name: str, root: Path, jobs: int, pythons: dict[str, Path]) -> dict[str, Any]:
    if name.startswith("gpusv"):
        return measure_gpusv(root, jobs, pythons.get(name))
    if name == "tsp":
        return measure_tsp(root, jobs, slots=SLOTS)
    if name == "hyperqueue":
        return measure_hyperqueue(root, jobs)
    return measure_floor(jobs)


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each system's medians, and gpusv's jobs/s over each peer's and over the best."""
    out: dict[str, Any] = {}
    for name, runs in rounds.items():
        ok = [r for r in runs if "skipped" not in r]
        if not ok:
            out[name] = {"skipped": runs[0]["skipped"] if runs else "not run"}
            continue
        med: dict[str, Any] = {"runs": len(ok)}
        for key in ok[0]:
            values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            if values and key not in ("jobs", "cores", "slots", "gpus_per_job"):
                med[key] = round(statistics.median(values), 3)
        med["machine_cpu_ms_per_job"] = round(1000 * med["machine_cpu_s"] / ok[0]["jobs"], 3)
        out[name] = med
    rates = {p: out[p]["jobs_per_s"] for p in PEERS if "jobs_per_s" in out.get(p, {})}
    for name in [n for n in rounds if n.startswith("gpusv")]:
        if "jobs_per_s" not in out.get(name, {}) or not rates:
            continue
        mine = out[name]["jobs_per_s"]
        ratios = out.setdefault("ratios", {})
        ratios.update({f"{name}/{p}": round(mine / r, 2) for p, r in rates.items()})
        ratios[f"{name}/best_peer"] = round(mine / max(rates.values()), 2)
    return out


def table(summary: dict[str, Any]) -> str:
    best = max(
        (summary[p]["jobs_per_s"] for p in PEERS if "jobs_per_s" in summary.get(p, {})),
        default=None,
    )
    names = [n for n in summary if n.startswith("gpusv")] or ["gpusv"]
    names += [n for n in SYSTEMS if n not in names]
    width = max(12, *(len(n) for n in names))
    lines = [f"{'system':<{width}} {'jobs/s':>8} {'x best peer':>12} {'machine ms/job':>15}  notes"]
    for name in names:
        s = summary.get(name, {})
        if "skipped" in s or not s:
            lines.append(f"{name:<{width}} {'-':>8} {'-':>12} {'-':>15}  {s.get('skipped', '')}")
            continue
        ratio = f"{s['jobs_per_s'] / best:.2f}" if best else "-"
        parts = [f"steal {s['steal_pct']:.0f} %"] if s.get("steal_pct") else []
        if name.startswith("gpusv"):
            parts.append(
                f"daemon {s['daemon_cpu_ms_per_job']:.2f} ms/job, "
                f"keepers {s['keeper_cpu_ms_per_job']:.2f} ms/job"
            )
        notes = "; ".join(parts)
        lines.append(
            f"{name:<{width}} {s['jobs_per_s']:>8.0f} {ratio:>12} "
            f"{s['machine_cpu_ms_per_job']:>15.2f}  {notes}".rstrip()
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("--jobs", type=int, default=1000, help="trivial jobs per system per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds; the systems take turns")
    p.add_argument("--out", type=Path, default=Path("bench/results/peers.json"))
    p.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds to wait at most, before the first round, for file creation to be quick",
    )
    p.add_argument(
        "--gpusv-python",
        type=Path,
        action="append",
        default=[],
        metavar="PYTHON",
        help="also run gpusv from an environment made with this python3 (repeatable)",
    )
    a = p.parse_args(argv)
    if a.jobs < 1 or a.rounds < 1:
        p.error("--jobs and --rounds must be at least 1")
    pythons = {"gpusv": Path(sys.executable)}
    for base in a.gpusv_python:
        if not base.exists():
            p.error(f"--gpusv-python {base}: no such file")
        try:
            pythons[f"gpusv@{base}"] = gpusv_env(base)
        except (OSError, subprocess.CalledProcessError) as e:
            p.error(f"--gpusv-python {base}: no environment could be made with it: {e}")
    systems = [*pythons, *SYSTEMS[1:]]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    create_us: list[float] = []
    loop_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpusv-peers-") as tmp:
        settled = _settle(Path(tmp), a.settle)
        for i in range(a.rounds):
            create_us.append(file_create_us(Path(tmp)))
            loop_ms.append(python_ms())
            sys.stderr.write(
                f"peers: round {i + 1}: an empty file's creation {create_us[-1]} µs, "
                f"the Python loop {loop_ms[-1]} ms\n"
            )
            for k, name in enumerate(systems):
                root = Path(tmp) / f"{k}-{i}"
                shares = cpu_shares()
                rounds[name].append(_once(name, root, a.jobs, pythons))
                rounds[name][-1]["steal_pct"] = steal_pct(shares, cpu_shares())
                sys.stderr.write(f"peers: round {i + 1} {name}: {rounds[name][-1]}\n")
    summary = summarise(rounds)
    ran_on = {name: interpreter(python) for name, python in pythons.items()}
    machine = {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_1m": round(os.getloadavg()[0], 2),
        "file_create_us": create_us,
        "python_ms": loop_ms,
        "settle_waited_s": settled,
        "gpusv_python": ran_on,
    }
    result = {"machine": machine, "jobs": a.jobs, "rounds": rounds, "summary": summary}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(summary))
    print(f"an empty file's creation before each round: {', '.join(map(str, create_us))} µs")
    print(f"the Python loop before each round: {', '.join(map(str, loop_ms))} ms ({cpu_model()})")
    for name, facts in ran_on.items():
        print(f"{name} ran on {describe(facts)}")
    print(f"\nwritten: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
