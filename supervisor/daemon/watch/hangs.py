"""GPU hangs and resets: the kernel-log watcher, card attribution, correlation of exits
with reset lines, and OOM-kill evidence. The line classifier itself is pure (faults/)."""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from supervisor.core.commands import AttemptEnded, HangSeen, Reclassify
from supervisor.core.jobs import ExitStatus, FailureReason
from supervisor.core.oom import oom_source
from supervisor.core.records import Attempt
from supervisor.daemon.broker import Broker
from supervisor.daemon.cgroups import oom_kill_count, own_memory_cgroup
from supervisor.daemon.clock import iso_from_epoch, now_iso
from supervisor.daemon.config import Config
from supervisor.daemon.engine import Engine
from supervisor.daemon.watch.memory import read_meminfo
from supervisor.faults.classifier import Classification, Classifier, FaultClass
from supervisor.faults.merge import attributed_bus, feed
from supervisor.faults.sources import KernelLine, follow

if TYPE_CHECKING:
    from supervisor.daemon.running.runner import Proc
    from supervisor.daemon.watch.gpu_monitor import GpuMonitor

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
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        broker: Broker,
        monitor: GpuMonitor,
        *,
        mem_total_mb: int,
        beat: Callable[[], None] = lambda: None,
        more_sources: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.engine = engine
        self.monitor = monitor
        self.cfg = cfg
        self.mem_total_mb = mem_total_mb
        self.beat = beat
        self.more_sources = more_sources  # () -> {name: lines}: NVML's Xid events
        self.window_s = cfg.gpu_hang.correlation_window_s
        self.classifier = Classifier()
        self.lines: deque[str] = deque(maxlen=200)
        self.faults: deque[Fault] = deque(maxlen=1000)
        self.failures: deque[tuple[float, int, Attempt, tuple[int, ...]]] = deque(maxlen=1000)
        self.oom_pids: dict[int, float] = {}
        self.squeezed_at = 0.0
        self.cgroup = own_memory_cgroup()
        self.fault_seen = anyio.Event()
        self.commands: list[HangSeen | Reclassify] = []
        self.send = anyio.Event()
        broker.subscribe(AttemptEnded, self.on_attempt_end)

    def recent(self) -> list[str]:
        return list(self.lines)

    # ---- the watcher ------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        def restarted(spec: str, exc: BaseException) -> None:
            log.warning("kernel-log source restarted", source=spec, error=repr(exc))

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeat)
            tg.start_soon(self._sender)
            task_status.started()
            sources = {"kernel": follow(self.cfg.kernel_log, on_restart=restarted)}
            await feed({**sources, **self.more_sources()}, self.on_line)

    def _command(self, cmd: HangSeen | Reclassify) -> None:
        self.commands.append(cmd)
        self.send.set()

    async def _sender(self) -> None:
        """The watcher's commands, in the order the lines came."""
        while True:
            await self.send.wait()
            self.send = anyio.Event()
            batch, self.commands = self.commands, []
            for cmd in batch:
                await self.engine.do(cmd)

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
        for job_id, live in self.engine.table.live.items():
            if card in live.cards and live.kill is not FailureReason.GPU_HANG:
                evidence = self._evidence([fault])
                self._command(HangSeen(job_id, card, evidence, self.machine(card, line.at)))
        self._reclassify_recent(fault, line.at)

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

    # ---- evidence ---------------------------------------------------------------------

    def machine(self, card: int | None, at: float | None = None) -> dict[str, Any]:
        """The readings of a hang record, taken when the hang is seen (before any abort)."""
        info = self.monitor.cards[card] if card is not None else None
        mem = read_meminfo()
        return {
            "gpu": card,
            "at": iso_from_epoch(at) if at is not None else now_iso(),
            "pci_bus_id": info.pci_bus_id if info else None,
            "driver_version": info.driver_version if info else None,
            "host_mem_available_mb": mem.available_mb,
            "swap_used_mb": mem.swap_used_mb,
            "vram_used_mb": info.vram_used_mb if info else None,
        }

    def watchdog_hang(self, job_id: int, card: int, evidence: dict[str, Any]) -> HangSeen:
        log.warning("no progress at idle GPU: treating as a hang", job_id=job_id, **evidence)
        return HangSeen(job_id, card, evidence, self.machine(card))

    def hang_evidence(self, cards: tuple[int, ...], since: float) -> dict[str, Any] | None:
        now = time.monotonic()
        # Lines from before this attempt began were about whoever had the card then.
        near = [
            f
            for f in self.faults
            if f.card in cards and now - f.mono <= self.window_s and f.mono >= since
        ]
        return self._evidence(near) if near else None

    async def wait_for_fault(self, cards: tuple[int, ...], since: float) -> dict[str, Any] | None:
        """A failed GPU job may have died of a reset whose line is still on its way."""
        if not cards:
            return None
        with anyio.move_on_after(min(EXIT_GRACE_S, self.window_s)):
            while (found := self.hang_evidence(cards, since)) is None:
                await self.fault_seen.wait()
            return found
        return None

    def oom_evidence(self, p: Proc, status: ExitStatus, own: int | None) -> str | None:
        """The facts core/oom.py's `oom_source` weighs; the daemon's counter read only
        where it could count."""
        sigkill = status.signal == signal.SIGKILL
        moved = in_log = False
        if sigkill:  # only then does more than `own` count (reading the cgroup costs)
            in_log = bool((set(p.handle.known) | {p.handle.pid}) & set(self.oom_pids))
            start = p.oom_kills_at_start
            if own is None and self.cgroup is not None and start is not None:
                count = oom_kill_count(self.cgroup)
                moved = count is not None and count > start
        return oom_source(
            sigkill=sigkill,
            own=own,
            in_kernel_log=in_log,
            daemon_moved=moved,
            squeezed=time.monotonic() - self.squeezed_at < 5.0,
        )

    def oom_kills_now(self) -> int | None:
        return oom_kill_count(self.cgroup) if self.cgroup is not None else None

    def note_memory(self, available_mb: int) -> None:
        threshold = self.cfg.host_memory.squeeze_below_mb(self.mem_total_mb)
        if available_mb < threshold:
            self.squeezed_at = time.monotonic()

    # ---- after an attempt ---------------------------------------------------------------

    def on_attempt_end(self, ev: AttemptEnded) -> None:
        if ev.attempt.reason in ("exit_nonzero", "signal") and ev.cards:
            self.failures.append((time.monotonic(), ev.job.id, ev.attempt, ev.cards))

    def _reclassify_recent(self, fault: Fault, at: float) -> None:
        """An exit that came before its card's reset line is a hang too; the engine
        decides whether it is still time to say so (its job queued for that retry)."""
        for item in list(self.failures):
            mono, job_id, attempt, cards = item
            if fault.card not in cards or fault.mono - mono > self.window_s:
                continue
            self.failures.remove(item)
            evidence = self._evidence([fault])
            self._command(Reclassify(job_id, attempt, evidence, self.machine(fault.card, at)))
