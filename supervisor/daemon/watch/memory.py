"""Host memory and per-job process-tree RSS, read from /proc through psutil.

Every call here blocks on procfs; the daemon runs them in a worker thread. Measure the
sampler's cost with `python -m supervisor.daemon.watch.memory` (see docs/host-memory.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil  # type: ignore[import-untyped]

from supervisor.daemon.watch.own_cgroup import memory_limit_mb

_MB = 1024 * 1024


@dataclass(frozen=True)
class MemInfo:
    total_mb: int
    available_mb: int  # MemAvailable: what can be had without swapping
    swap_used_mb: int


def read_meminfo() -> MemInfo:
    """Figures from /proc/meminfo, with the total capped at the memory limit of the cgroup
    gpusvd runs in (its allocation: a Slurm job, a pod): the ledger is sized by it."""
    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    total = vm.total // _MB
    allocation = memory_limit_mb()
    if allocation is not None:
        total = min(total, allocation)
    return MemInfo(total, vm.available // _MB, swap.used // _MB)


@functools.cache
def _meminfo_fd() -> int:
    return os.open("/proc/meminfo", os.O_RDONLY | os.O_CLOEXEC)


def available_mb() -> int:
    """MemAvailable alone, from one read of /proc/meminfo: what every dispatch pass needs,
    without read_meminfo's swap and cgroup-limit reads. The file stays open: each pass
    costs one pread, not the six calls of an open, read and close."""
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(_meminfo_fd(), 8192, 0)
        at = text.find(b"MemAvailable:")
        if at >= 0:
            return int(text[at + 13 : text.index(b"kB", at)]) // 1024
    return read_meminfo().available_mb


@dataclass(frozen=True)
class TreeSample:
    rss_mb: int  # summed over the tree; shared pages count once per process
    pids: frozenset[int]
    peak_mb: int  # the highest rss_mb this sampler has seen for the job


@dataclass(frozen=True)
class _Proc:
    ppid: int
    born: float  # create_time: tells a remembered pid from a reused one
    handle: psutil.Process

    def rss(self) -> int:
        try:
            return int(self.handle.memory_info().rss)
        except psutil.Error:  # gone since the pass, a zombie, or not ours to read
            return 0


class TreeSampler:
    """Sums RSS over each job's process tree, one pass over /proc for all jobs.

    A job's tree is its root and every descendant by ppid. Processes seen in the tree
    before are remembered (with their start time, against pid reuse), so a daemonized
    descendant reparented to init or a subreaper still counts, with its own children.
    A job's memory is forgotten once it is no longer among the roots.
    """

    def __init__(self) -> None:
        self._members: dict[int, dict[int, float]] = {}  # job -> pid -> create_time
        self._peaks: dict[int, int] = {}

    def sample(
        self, roots: Mapping[int, int], known: Mapping[int, Iterable[int]] | None = None
    ) -> dict[int, TreeSample]:
        """roots: job id -> root pid; known: job id -> pids the caller knows are the job's."""
        for gone in set(self._members) - set(roots):
            del self._members[gone]
            self._peaks.pop(gone, None)
        if not roots:
            return {}
        procs = _snapshot()
        children: defaultdict[int, list[int]] = defaultdict(list)
        for pid, proc in procs.items():
            children[proc.ppid].append(pid)
        claimed: set[int] = set()
        samples: dict[int, TreeSample] = {}
        for job_id in sorted(roots):
            seeds = self._seeds(job_id, roots[job_id], procs, (known or {}).get(job_id, ()))
            tree = _descendants(seeds, children, claimed)
            claimed |= tree
            self._members[job_id] = {pid: procs[pid].born for pid in tree}
            rss_mb = sum(procs[pid].rss() for pid in tree) // _MB
            peak = max(rss_mb, self._peaks.get(job_id, 0))
            self._peaks[job_id] = peak
            samples[job_id] = TreeSample(rss_mb, frozenset(tree), peak)
        return samples

    def _seeds(
        self, job_id: int, root: int, procs: Mapping[int, _Proc], known: Iterable[int]
    ) -> set[int]:
        remembered = self._members.get(job_id, {})
        seeds = {p for p, born in remembered.items() if p in procs and procs[p].born == born}
        if root in procs:
            seeds.add(root)
        # A process started before the job's root cannot be part of the job.
        floor = procs[root].born if root in procs else remembered.get(root)
        seeds.update(
            pid for pid in known if pid in procs and (floor is None or procs[pid].born >= floor)
        )
        return seeds


def _snapshot() -> dict[int, _Proc]:
    """Every process once, with its parent and start time.

    RSS is read afterwards and only for processes in a job's tree: most of a host's
    processes belong to no job, and reading their memory would double the pass's cost.
    """
    procs: dict[int, _Proc] = {}
    for p in psutil.process_iter(["ppid", "create_time"]):
        ppid, born = p.info["ppid"], p.info["create_time"]
        if ppid is not None and born is not None:
            procs[p.pid] = _Proc(ppid, born, p)
    return procs


def _descendants(
    seeds: Iterable[int], children: Mapping[int, list[int]], claimed: set[int]
) -> set[int]:
    tree: set[int] = set()
    stack = [pid for pid in seeds if pid not in claimed]
    while stack:
        pid = stack.pop()
        if pid in tree:
            continue
        tree.add(pid)
        stack.extend(c for c in children.get(pid, ()) if c not in claimed and c not in tree)
    return tree


def measure_sampler_cost(jobs: int = 10, per_job: int = 3, passes: int = 200) -> dict[str, float]:
    """Start `jobs` trees of `per_job` processes each and time `passes` sampler passes."""
    sleepers = " ".join(["sleep 600 &"] * (per_job - 1))
    trees = [subprocess.Popen(["sh", "-c", f"{sleepers} wait"]) for _ in range(jobs)]
    try:
        roots = {i: p.pid for i, p in enumerate(trees)}
        sampler = TreeSampler()
        deadline = time.monotonic() + 10
        while sum(len(s.pids) for s in sampler.sample(roots).values()) < jobs * per_job:
            if time.monotonic() > deadline:
                raise RuntimeError("the test trees did not start")
            time.sleep(0.05)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(passes):
            sampler.sample(roots)
        cpu_s = (time.process_time() - cpu) / passes
        wall_s = (time.perf_counter() - wall) / passes
    finally:
        for p in trees:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(p.pid).children(recursive=True):
                    child.kill()
            p.kill()
            p.wait()
    host_processes = len(psutil.pids())
    return {
        "processes_on_host": float(host_processes),
        "cpu_s_per_pass": cpu_s,
        "wall_s_per_pass": wall_s,
        "cpu_s_per_job_per_pass": cpu_s / jobs,
        "cpu_s_per_host_process_per_pass": cpu_s / host_processes,
    }


if __name__ == "__main__":
    for name, value in measure_sampler_cost().items():
        sys.stdout.write(f"{name}: {value:.6g}\n")
