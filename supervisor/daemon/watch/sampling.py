"""The periodic sampler: process-tree RSS and peaks, the squeeze guard, job progress and
the no-progress watchdog. One pass over /proc per interval for all jobs, off the loop."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from supervisor.core.commands import Progress, Stop
from supervisor.core.jobs import FailureReason
from supervisor.core.oom import squeeze_victims
from supervisor.core.table import claimed_ahead, waiting_ahead
from supervisor.daemon.clock import epoch_from_iso
from supervisor.daemon.config import Config
from supervisor.daemon.engine import Engine
from supervisor.daemon.store import output_files as joblogs
from supervisor.daemon.watch.memory import TreeSampler, read_meminfo
from supervisor.faults.cputime import cpu_seconds
from supervisor.faults.watchdog import (
    ProgressTracker,
    job_utilization,
    verdict,
    watchdog_evidence,
)

if TYPE_CHECKING:
    from supervisor.daemon.dispatcher import Dispatcher
    from supervisor.daemon.running.runner import Proc, Runner
    from supervisor.daemon.watch.gpu_monitor import GpuMonitor
    from supervisor.daemon.watch.hangs import HangWatcher

log = structlog.get_logger("gpusvd.sampler")
READ_LIMIT = 256 * 1024  # new output scanned for the progress regex, per pass


class Sampler:
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        runner: Runner,
        dispatcher: Dispatcher,
        monitor: GpuMonitor,
        hangs: HangWatcher,
    ) -> None:
        self.engine = engine
        self.table = engine.table
        self.runner = runner
        self.dispatcher = dispatcher
        self.monitor = monitor
        self.hangs = hangs
        self.cfg = cfg.host_memory
        self.ahead_s = cfg.jobs.start_ahead_s
        self.max_log = cfg.logs.max_size
        self.tree = TreeSampler()
        self.offsets: dict[tuple[int, int], int] = {}
        self.cpu_s = 0.0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.cfg.sample_interval_s)
            if not self.runner.procs:
                continue
            start = time.thread_time()
            try:
                await self.pass_once()
            except OSError as exc:  # out of descriptors (a flood): skip a pass, not the daemon
                log.warning("sampler pass skipped", error=str(exc))
            self.cpu_s += time.thread_time() - start

    async def pass_once(self) -> None:
        running = list(self.runner.procs.values())
        roots = {r.job_id: r.handle.pid for r in running}
        known = {r.job_id: list(r.handle.known) for r in running}
        samples = await anyio.to_thread.run_sync(self.tree.sample, roots, known)
        for r in running:
            s = samples.get(r.job_id)
            if s is None:
                continue
            r.rss_mb = s.rss_mb
            r.peak_rss_mb = max(r.peak_rss_mb, s.rss_mb)
            r.handle.remember(s.pids)
        await self._vram(running, {j: set(s.pids) for j, s in samples.items()})
        meminfo = read_meminfo()
        self.hangs.note_memory(meminfo.available_mb)
        await self._squeeze(meminfo.available_mb)
        await self._watchdog(running)
        await self._limits(running)
        await self._overrun()
        if self.table.held_counts():
            self.dispatcher.poke()  # the ledger moved: held jobs may fit now

    async def _vram(self, running: list[Proc], pids: dict[int, set[int]]) -> None:
        """Each job's VRAM as the backend reads its processes (one query per card in use);
        nothing where the backend cannot tell."""
        m = self.monitor
        skip = m.recovering | m.resetting | set(m.lost_why) | m._in_flight
        cards = sorted({c for r in running for c in r.cards} - skip)
        per_card: dict[int, dict[int, int]] = {}
        backend = m.backend
        for card in cards:
            try:
                per_card[card] = await m.call(
                    functools.partial(backend.process_vram_mb, card), f"gpu-procs-{card}"
                )
            except Exception:  # a lost or busy card: its figure stays as it was
                continue
        for r in running:
            mine = pids.get(r.job_id, set()) | {r.handle.pid}
            used = sum(
                mb for c in r.cards for pid, mb in per_card.get(c, {}).items() if pid in mine
            )
            r.peak_vram_mb = max(r.peak_vram_mb, used)

    async def _squeeze(self, available_mb: int) -> None:
        """Stop the newest jobs before the kernel has to choose, and before the box thrashes."""
        threshold = self.cfg.squeeze_below_mb(self.dispatcher.mem_total_mb)
        if available_mb >= threshold:
            return
        candidates = [
            (r.job_id, r.seq, r.rss_mb)
            for r in self.runner.procs.values()
            if self._kill_of(r.job_id) is None
        ]
        # Jobs already being stopped hold their memory through the kill grace, and a dying
        # one reads as empty before MemAvailable shows what it gave back: their peaks count
        # as on the way back, or every pass would stop one more job meanwhile.
        stopping_mb = sum(
            r.peak_rss_mb for r in self.runner.procs.values() if self._kill_of(r.job_id) is not None
        )
        victims = squeeze_victims(available_mb + stopping_mb, threshold, candidates)
        for job_id in victims:
            r = self.runner.procs[job_id]
            evidence = {
                "source": "squeeze_guard",
                "mem_available_mb": available_mb,
                "squeeze_below_mb": threshold,
                "rss_mb": r.rss_mb,
            }
            log.warning("squeeze guard stops the newest job", job_id=job_id, **evidence)
            await self.engine.do(Stop(job_id, FailureReason.OOM_KILLED, evidence))

    async def _limits(self, running: list[Proc]) -> None:
        """Wall-time limits (--time), and the size cap of the jobs' logs."""
        now = time.time()
        for r in running:
            job, live = self.table.jobs.get(r.job_id), self.table.live.get(r.job_id)
            limit = job.spec.time_limit_s if job else None
            if not limit or live is None or live.kill is not None:
                continue
            if past_limit(live.attempt.started_at, limit, now):
                log.info("wall-time limit reached", job_id=r.job_id, limit_s=limit)
                evidence = {"source": "time_limit", "limit_s": limit}
                await self.engine.do(Stop(r.job_id, FailureReason.TIMEOUT, evidence))
        for r in running:
            for path in self.runner.log_paths(r.job_id):
                with contextlib.suppress(OSError):
                    if os.stat(path).st_size > self.max_log:
                        cut = await anyio.to_thread.run_sync(joblogs.cap, path, self.max_log)
                        log.info("job log cut", job_id=r.job_id, path=str(path), bytes=cut)

    async def _overrun(self) -> None:
        """A job claimed ahead of one that has now run twice `start_ahead_s` (its kind ran
        short before, this run does not) goes back to the queue: bound to that card or
        slot, it would wait however long that job runs while another may free first."""
        limit, now = 2 * self.ahead_s, time.time()
        for job_id, _ in claimed_ahead(self.table.live):
            # Read again at each: a release awaits the engine, and meanwhile the job in
            # front of the next one may have ended (and that one started), or either may
            # have been stopped.
            lives = self.table.live
            live = lives.get(job_id)
            if live is None or live.kill is not None or not waiting_ahead(live, lives):
                continue
            assert live.after is not None  # waiting ahead: it follows one still live
            before = lives[live.after[0]]
            if past_limit(before.attempt.started_at, limit, now):
                message = f"job {live.after[0]} ahead of it ran past {limit:g} s; queued again"
                log.info("start ahead released", job_id=job_id, after=live.after[0])
                await self.dispatcher.release_ahead(message, [job_id])

    def _kill_of(self, job_id: int) -> FailureReason | None:
        live = self.table.live.get(job_id)
        return live.kill if live is not None else None

    def _progress(self, r: Proc, now: float) -> ProgressTracker:
        job = self.table.jobs.get(r.job_id)
        if r.tracker is None:
            regex = job.spec.progress_regex if job else None
            r.tracker = ProgressTracker(regex, r.started_mono)
        out, err = self.runner.log_paths(r.job_id)
        for stream, path in ((0, out), (1, err)):
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            key = (r.job_id * 2 + stream, r.n)
            offset = self.offsets.setdefault(key, size if r.n > 1 else 0)
            if size < offset:  # the log was cut (logs.max_size)
                self.offsets[key] = offset = size
            if size > offset:
                if job and job.spec.progress_regex:
                    r.tracker.on_output(_read(path, offset, size), now)
                else:
                    r.tracker.on_size(size, now)
                self.offsets[key] = size
        return r.tracker

    async def _watchdog(self, running: list[Proc]) -> None:
        now = time.monotonic()
        for r in running:
            job = self.table.jobs.get(r.job_id)
            if job is None:
                continue
            tracker = self._progress(r, now)
            if tracker.last_match and tracker.last_match != job.progress:
                await self.engine.do(Progress(r.job_id, tracker.last_match))
            if not r.cards or self._kill_of(r.job_id) is not None:
                continue
            util = job_utilization([self.monitor.cards[c].utilization_pct for c in r.cards])
            tracker.on_utilization(util, now, _tree_cpu_s(r))
            if tracker.first_unknown():
                log.info(
                    "gpu utilization unknown: the idle watchdog cannot judge this job",
                    job_id=r.job_id,
                    gpus=list(r.cards),
                    stall_timeout_s=job.spec.stall_timeout_s,
                )
            timeout = job.spec.progress_timeout_s
            stall = job.spec.stall_timeout_s
            ruling = verdict(tracker.state(), now=now, timeout_s=timeout, stall_timeout_s=stall)
            if ruling != "ok":
                evidence = watchdog_evidence(tracker.state(), ruling, now, timeout, stall)
                evidence["cpu_percent"] = _cpu_percent(r)
                await self.engine.do(self.hangs.watchdog_hang(r.job_id, r.cards[0], evidence))
        for key in [k for k in self.offsets if k[0] // 2 not in self.runner.procs]:
            del self.offsets[key]


def past_limit(started_at: str, limit_s: float, now: float) -> bool:
    """Whether an attempt started then has run past its wall-time limit. Pure."""
    return now - epoch_from_iso(started_at) > limit_s


def _read(path: Any, start: int, end: int) -> str:
    first = max(start, end - READ_LIMIT)
    with open(path, "rb") as fh:
        fh.seek(first)
        return fh.read(end - first).decode("utf-8", "replace")


def _tree_cpu_s(r: Proc) -> float | None:
    """CPU seconds the job's processes have used, for the watchdog's idle rule."""
    return cpu_seconds({r.handle.pid, *r.handle.known})


def _cpu_percent(r: Proc) -> float | None:
    if r.handle.leader is None:
        return None
    try:
        times = r.handle.leader.cpu_times()
        elapsed = max(time.monotonic() - r.started_mono, 1e-6)
        return round(100.0 * float(times.user + times.system) / elapsed, 1)
    except Exception:
        return None
