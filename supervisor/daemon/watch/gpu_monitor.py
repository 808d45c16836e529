"""Polls the GPU backend off the event loop and keeps the latest reading of every card.

Every backend call runs on its own thread under the deadman: a query that blocks past the
abort deadline is a wedged driver, and the deadman restarts the daemon. One query per
card is in flight at a time, so a slow card never piles up threads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import structlog

from supervisor.core.admission import Card
from supervisor.daemon.clock import monotonic
from supervisor.gpus.allocation import describe_allocation
from supervisor.gpus.base import GpuBackend, GpuError, GpuInfo, GpuLost, GpuResetting
from supervisor.gpus.health import placeable
from supervisor.gpus.release import release_backend
from supervisor.gpus.visibility import VisibleBy, identify

RELEASED = "released: the GPU driver was let go of (SIGUSR1); SIGUSR2 takes it back"
log = structlog.get_logger("gpusvd.gpus")
# A poke reads the cards at once unless they were read this recently: a flood of short
# jobs would otherwise start a query thread per card for every job.
POKE_GAP_S = 0.2
T = TypeVar("T")
Call = Callable[[Callable[[], T], str], Awaitable[T]]


class GpuMonitor:
    def __init__(
        self,
        backend: GpuBackend,
        call: Callable[[Callable[[], Any], str], Awaitable[Any]],
        *,
        interval_s: float = 1.0,
        idle_interval_s: float = 1.0,
        busy: Callable[[], bool] = lambda: True,
        on_change: Callable[[], None] = lambda: None,
        beat: Callable[[], None] = lambda: None,
        visible_by: VisibleBy = "index",
    ) -> None:
        self.backend = backend
        self.call = call
        self.interval_s = interval_s
        # An idle box is read as often as a busy one: `gpusv health` (a Slurm health
        # check, a router) must see a card lost or back within one reading, ~1 s.
        self.idle_interval_s = idle_interval_s
        self.busy = busy
        self._wake = anyio.Event()
        self.on_change = on_change
        self.beat = beat
        self.cards: list[GpuInfo] = []
        self.lost_why: dict[int, str] = {}
        self._in_flight: set[int] = set()
        self._quarantine: dict[int, float] = {}  # card -> monotonic time to re-probe from
        self.recovering: set[int] = set()  # cards being re-probed after a hang: no placements
        self.resetting: set[int] = set()  # the driver refuses reads while it resets: no placements
        self.unanswered: set[int] = set()  # cards whose keeper does not answer: no placements
        self.visible_by = visible_by  # what CUDA_/ROCR_VISIBLE_DEVICES carry
        self.allocation: str | None = None  # the visibility variable gpusvd itself was given
        self.released = False  # the driver was let go of (SIGUSR1): no reading, no placing

    async def discover(self) -> None:
        self.cards = list(await self.call(self.backend.discover, "gpu-discover"))
        self.allocation = describe_allocation(self.backend)

    def by_bus_id(self, bus_id: str) -> int | None:
        for card in self.cards:
            if card.pci_bus_id == bus_id:
                return card.index
        return None

    def vendors(self) -> set[str]:
        return {c.vendor for c in self.cards}

    def admission_cards(self) -> list[Card]:
        return [
            Card(
                index=c.index,
                vram_total_mb=c.vram_total_mb,
                vram_used_mb=c.vram_used_mb,
                healthy=placeable(c)
                and c.index not in self.recovering | self.resetting | self.unanswered,
                running=(),
            )
            for c in self.cards
        ]

    def visibility_env(self, indices: tuple[int, ...]) -> dict[str, str]:
        cards = [self.cards[i] for i in indices]
        return identify(self.backend.visibility_env(cards), cards, self.visible_by)

    def uuids_of(self, indices: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.cards[i].uuid for i in indices)

    def mark_lost(self, index: int, why: str, quarantine_s: float = 0.0) -> None:
        """A card the kernel says fell off the bus stays out for `quarantine_s` even if the
        backend still answers: the answer may be stale, and a job would fail on it again."""
        if index >= len(self.cards):
            return
        if quarantine_s:
            self._quarantine[index] = monotonic() + quarantine_s
        card = self.cards[index]
        self.lost_why[index] = why
        if card.health != "lost":
            self.cards[index] = dataclasses.replace(card, health="lost")
            log.warning("gpu lost", gpu=index, pci_bus_id=card.pci_bus_id, why=why)
            self.on_change()

    async def probe(self, index: int) -> GpuInfo | None:
        """A fresh reading of one card; a lost card returns to ok once it answers again."""
        if index in self._in_flight or self.released:
            return None
        self._in_flight.add(index)
        try:
            info: GpuInfo = await self.call(lambda: self.backend.query(index), f"gpu-query-{index}")
        except GpuLost as exc:
            self.mark_lost(index, str(exc) or "backend reports the card lost")
            return None
        except GpuResetting as exc:
            self._resetting(index, str(exc))
            return None
        except Exception as exc:  # a backend bug must not take the monitor down
            log.warning("gpu query failed", gpu=index, error=repr(exc))
            return None
        finally:
            self._in_flight.discard(index)
        if index in self.resetting:
            self.resetting.discard(index)
            self.on_change()
        old = self.cards[index]
        if old.health == "lost" and monotonic() < self._quarantine.get(index, 0.0):
            return None
        if old.health == "lost" and info.health == "ok":
            log.warning("gpu back", gpu=index, pci_bus_id=info.pci_bus_id)
            self.lost_why.pop(index, None)
        self.cards[index] = info
        if (old.health, old.vram_used_mb) != (info.health, info.vram_used_mb):
            self.on_change()
        return info

    def _resetting(self, index: int, why: str) -> None:
        if index not in self.resetting:
            self.resetting.add(index)
            log.warning("gpu resetting", gpu=index, why=why)
            self.on_change()

    def poke(self) -> None:
        """Read the cards now (a job just started: the watchdog needs fresh utilization)."""
        self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            task_status.started()
            while True:
                self.beat()
                read_at = monotonic()
                for card in list(self.cards):
                    tg.start_soon(self.probe, card.index)
                with anyio.move_on_after(self.interval_s if self.busy() else self.idle_interval_s):
                    await self._wake.wait()
                self._wake = anyio.Event()
                rest = read_at + min(POKE_GAP_S, self.interval_s) - monotonic()
                if rest > 0:
                    await anyio.sleep(rest)

    async def release_driver(self) -> None:
        """SIGUSR1: shut NVML down; every card reads lost (released) until taken back."""
        if self.released:
            return
        self.released = True
        await release_backend(self.backend)
        for card in list(self.cards):
            self.mark_lost(card.index, RELEASED)
        log.warning("gpu driver released", cards=len(self.cards))

    async def reacquire_driver(self) -> None:
        """SIGUSR2: open the driver again; the cards come back only as the same cards."""
        if not self.released:
            return
        try:
            await anyio.to_thread.run_sync(self.backend.reopen)
            fresh = list(await self.call(self.backend.discover, "gpu-rediscover"))
        except GpuError as exc:
            log.error("gpu driver not taken back", error=str(exc))
            return
        before = [(c.uuid, c.pci_bus_id) for c in self.cards]
        if [(c.uuid, c.pci_bus_id) for c in fresh] != before:
            log.error(
                "gpu driver taken back, but the cards changed: restart gpusvd to use them",
                before=before,
                after=[(c.uuid, c.pci_bus_id) for c in fresh],
            )
            return
        self.cards = fresh
        self.lost_why = {c.index: self.lost_why.get(c.index, "") for c in fresh if c.health != "ok"}
        self.released = False
        self.on_change()
        log.warning("gpu driver taken back", cards=len(fresh))
