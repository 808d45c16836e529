"""GPU hangs and resets: the kernel-log watcher, card attribution, correlation of exits
with reset lines, and OOM-kill evidence. The line classifier itself is pure (faults/)."""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobState
from supervisor.daemon.cgroups import oom_kill_count, own_memory_cgroup
from supervisor.daemon.clock import iso_from_epoch, now_iso
from supervisor.daemon.config import Config
from supervisor.daemon.memory import read_meminfo
from supervisor.daemon.store import Attempt, Event
from supervisor.faults.classifier import Classification, Classifier, FaultClass
from supervisor.faults.merge import attributed_bus, feed
from supervisor.faults.sources import KernelLine, follow

if TYPE_CHECKING:
    from supervisor.daemon.attempts import AttemptRunner
    from supervisor.daemon.gpu_monitor import GpuMonitor
    from supervisor.daemon.scheduler import Running, Scheduler

log = structlog.get_logger("gpusvd.hangs")
KILLED_PROCESS = re.compile(r"Killed process (\d+)")
HANG_CLASSES = (FaultClass.GPU_HANG, FaultClass.GPU_LOST)
LOST_QUARANTINE_S = 60.0  # a card the kernel calls lost stays out at least this long
EXIT_GRACE_S = 2.0  # a failed GPU job's end waits this long for a reset line to arrive


@dataclasses.dataclass(frozen=True)
class Fault:
    mono: float
    wall: float
    card: int
    cls: Classification


class HangWatcher:
    def __init__(self, sched: Scheduler, monitor: GpuMonitor, cfg: Config) -> None:
        self.sched = sched
        self.monitor = monitor
        self.cfg = cfg
        self.window_s = cfg.gpu_hang.correlation_window_s
        self.attempts: AttemptRunner | None = None
        self.classifier = Classifier()
        self.lines: deque[str] = deque(maxlen=200)
        self.faults: deque[Fault] = deque(maxlen=1000)
        self.failures: deque[tuple[float, int, int, tuple[int, ...]]] = deque(maxlen=1000)
        self.oom_pids: dict[int, float] = {}
        self.squeezed_at = 0.0
        self.cgroup = own_memory_cgroup()
        self.fault_seen = anyio.Event()
        self.beat: Any = lambda: None
        self.reclassified: Any = lambda job, attempt: None  # the operator's on_gpu_hang hook
        self.more_sources: Any = dict  # () -> {name: lines}: NVML's Xid events, set by the daemon

    def recent(self) -> list[str]:
        return list(self.lines)

    # ---- the watcher ------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        def restarted(spec: str, exc: BaseException) -> None:
            log.warning("kernel-log source restarted", source=spec, error=repr(exc))

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeat)
            task_status.started()
            sources = {"kernel": follow(self.cfg.kernel_log, on_restart=restarted)}
            await feed({**sources, **self.more_sources()}, self.on_line)

    async def _heartbeat(self) -> None:
        while True:
            self.beat()
            await anyio.sleep(5.0)

    def on_line(self, line: KernelLine) -> None:
        self.lines.append(line.text)
        killed = KILLED_PROCESS.search(line.text)
        if killed:
            self.oom_pids[int(killed.group(1))] = time.monotonic()
        cls = self.classifier.feed(line.text)
        if cls.fault_class not in HANG_CLASSES:
            return
        card = self.card_for(cls, line.device)
        if card is None:
            log.warning("gpu fault on no known card", line=line.text, bus_id=cls.pci_bus_id)
            return
        fault = Fault(time.monotonic(), line.at, card, cls)
        self.faults.append(fault)
        log.warning(
            "gpu fault",
            gpu=card,
            fault_class=cls.fault_class.value,
            xid=cls.xid,
            line=line.text,
        )
        if cls.fault_class is FaultClass.GPU_LOST:
            self.monitor.mark_lost(card, line.text.strip()[:200], LOST_QUARANTINE_S)
        self.fault_seen.set()
        self.fault_seen = anyio.Event()
        for r in list(self.sched.running.values()):
            if card in r.cards and r.kill_reason is not FailureReason.GPU_HANG:
                evidence = self._evidence([fault])
                assert self.sched.tg is not None
                self.sched.tg.start_soon(self.abort_hung, r, card, evidence)
        self._reclassify_recent(fault)

    def card_for(self, cls: Classification, device: str | None = None) -> int | None:
        """By bus id (the line's own, else the device the kernel filed it under); a line
        naming none only when exactly one card of its vendor exists."""
        bus = attributed_bus(cls.pci_bus_id, device)
        if bus:
            return self.monitor.by_bus_id(bus)
        same = [
            c.index for c in self.monitor.cards if c.vendor == cls.vendor or c.vendor == "simulated"
        ]
        return same[0] if len(same) == 1 else None

    def _evidence(self, faults: list[Fault], source: str = "kernel_log") -> dict[str, Any]:
        return {
            "source": source,
            "lines": [f.cls.line for f in faults],
            "at": [iso_from_epoch(f.wall) for f in faults],
            "class": faults[-1].cls.fault_class.value,
            "xid": faults[-1].cls.xid,
        }

    # ---- acting on a hang -------------------------------------------------------------

    async def abort_hung(self, r: Running, card: int, evidence: dict[str, Any]) -> None:
        """Kill the tree, wait for every process to be gone, re-probe the card: all under
        the deadman, since each step can block forever on a wedged driver."""
        assert self.attempts is not None
        backend = self.monitor.backend
        self.monitor.recovering.add(card)
        self.monitor.on_change()
        try:
            await self.attempts.stop(
                r, FailureReason.GPU_HANG, evidence, after_kill=lambda: backend.query(card)
            )
        finally:
            self.monitor.recovering.discard(card)
            self.monitor.on_change()

    async def watchdog_hang(self, r: Running, evidence: dict[str, Any]) -> None:
        log.warning("no progress at idle GPU: treating as a hang", job_id=r.job_id, **evidence)
        await self.abort_hung(r, r.cards[0], evidence)

    def hang_evidence(self, r: Running) -> dict[str, Any] | None:
        now = time.monotonic()
        # Lines from before this attempt began were about whoever had the card then.
        near = [
            f
            for f in self.faults
            if f.card in r.cards and now - f.mono <= self.window_s and f.mono >= r.started_mono
        ]
        return self._evidence(near) if near else None

    async def wait_for_fault(self, r: Running) -> dict[str, Any] | None:
        """A failed GPU job may have died of a reset whose line is still on its way."""
        if not r.cards:
            return None
        with anyio.move_on_after(min(EXIT_GRACE_S, self.window_s)):
            while (found := self.hang_evidence(r)) is None:
                await self.fault_seen.wait()
            return found
        return None

    def oom_evidence(self, r: Running, status: ExitStatus) -> str | None:
        if status.signal != signal.SIGKILL:
            return None
        pids = set(r.handle.known) | {r.handle.pid} if r.handle else set()
        if pids & set(self.oom_pids):
            return "kernel_log"
        if self.cgroup is not None and r.oom_kills_at_start is not None:
            count = oom_kill_count(self.cgroup)
            if count is not None and count > r.oom_kills_at_start:
                return "cgroup_oom_kill"
        if time.monotonic() - self.squeezed_at < 5.0:
            return "memory_squeeze"
        return None

    def oom_kills_now(self) -> int | None:
        return oom_kill_count(self.cgroup) if self.cgroup is not None else None

    def note_memory(self, available_mb: int) -> None:
        threshold = self.cfg.host_memory.squeeze_below_mb(self.sched.mem_total_mb)
        if available_mb < threshold:
            self.squeezed_at = time.monotonic()

    # ---- after an attempt ---------------------------------------------------------------

    def on_attempt_end(self, job: Job, r: Running) -> None:
        reason = r.attempt.reason
        if reason == FailureReason.GPU_HANG.value:
            assert self.sched.tg is not None
            self.sched.tg.start_soon(self.record, job, r.attempt)
        elif reason in ("exit_nonzero", "signal") and r.cards:
            self.failures.append((time.monotonic(), job.id, r.attempt.n, r.cards))

    async def record(self, job: Job, attempt: Attempt) -> None:
        """A hang record: the attempt (its card, evidence) and the machine at this moment."""
        card = attempt.gpus[0] if attempt.gpus else None
        info = self.monitor.cards[card] if card is not None else None
        mem = read_meminfo()
        await self.sched.store.record_hang(
            {
                "job": job.id,
                "attempt": attempt.n,
                "gpu": card,
                "pci_bus_id": info.pci_bus_id if info else None,
                "driver_version": info.driver_version if info else None,
                "at": now_iso(),
                "evidence": attempt.evidence,
                "host_mem_available_mb": mem.available_mb,
                "swap_used_mb": mem.swap_used_mb,
                "vram_used_mb": info.vram_used_mb if info else None,
                "labels": dict(job.spec.labels),
            }
        )

    def _reclassify_recent(self, fault: Fault) -> None:
        """An exit that came before its card's reset line is a hang too, if its job is
        still queued for a retry: the retry moves from the ordinary to the hang budget."""
        for mono, job_id, n, cards in list(self.failures):
            if fault.card not in cards or fault.mono - mono > self.window_s:
                continue
            job = self.sched.jobs.get(job_id)
            if job is None or job.state is not JobState.QUEUED or job.attempts != n:
                continue
            self.failures.remove((mono, job_id, n, cards))
            assert self.sched.tg is not None
            self.sched.tg.start_soon(self._reclassify, job, n, self._evidence([fault]))

    async def _reclassify(self, job: Job, n: int, evidence: dict[str, Any]) -> None:
        fixed = dataclasses.replace(
            job,
            reason=FailureReason.GPU_HANG,
            ordinary_used=max(0, job.ordinary_used - 1),
            gpu_hang_used=job.gpu_hang_used + 1,
        )
        store = self.sched.store
        attempts = await store.attempts(job.id)
        attempt = next(a for a in attempts if a.n == n)
        ended = dataclasses.replace(attempt, reason=FailureReason.GPU_HANG.value, evidence=evidence)
        message = f"attempt {n} reclassified as gpu_hang: a reset line for its GPU followed"
        await store.save(fixed, now_iso(), Event("gpu_hang", message), ended_attempt=ended)
        self.sched.put(fixed)
        await self.record(fixed, ended)
        self.reclassified(fixed, ended)
