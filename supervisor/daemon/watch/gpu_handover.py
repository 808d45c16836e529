"""Letting go of the GPU driver while the daemon runs, and taking it back.

NVML holds the driver open for as long as it is initialized, and the driver refuses a
GPU reset (`nvidia-smi -r`) or a MIG change while anyone holds it. NVML cannot let go of
one card, so SIGUSR1 makes gpusvd shut NVML down for all of them: every card reads
`lost` ("released"), nothing new is placed, running jobs go on. SIGUSR2 takes the driver
again and reads every card afresh; a card comes back only as the same card (same UUID
and bus id at the same index), so that indices still mean what they meant.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import structlog

from supervisor.gpus.base import GpuError
from supervisor.gpus.release import release_backend

if TYPE_CHECKING:
    from supervisor.daemon.watch.gpu_monitor import GpuMonitor

log = structlog.get_logger("gpusvd.gpus")
RELEASED = "released: the GPU driver was let go of (SIGUSR1); SIGUSR2 takes it back"


async def handover_signals(monitor: GpuMonitor) -> None:
    with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                await release(monitor)
            else:
                await reacquire(monitor)


async def release(monitor: GpuMonitor) -> None:
    if monitor.released:
        return
    monitor.released = True
    await release_backend(monitor.backend)
    for card in list(monitor.cards):
        monitor.mark_lost(card.index, RELEASED)
    log.warning("gpu driver released", cards=len(monitor.cards))


async def reacquire(monitor: GpuMonitor) -> None:
    if not monitor.released:
        return
    try:
        await anyio.to_thread.run_sync(monitor.backend.reopen)
        fresh = list(await monitor.call(monitor.backend.discover, "gpu-rediscover"))
    except GpuError as exc:
        log.error("gpu driver not taken back", error=str(exc))
        return
    before = [(c.uuid, c.pci_bus_id) for c in monitor.cards]
    if [(c.uuid, c.pci_bus_id) for c in fresh] != before:
        log.error(
            "gpu driver taken back, but the cards changed: restart gpusvd to use them",
            before=before,
            after=[(c.uuid, c.pci_bus_id) for c in fresh],
        )
        return
    monitor.cards = fresh
    monitor.lost_why = {
        c.index: monitor.lost_why.get(c.index, "") for c in fresh if c.health != "ok"
    }
    monitor.released = False
    monitor.on_change()
    log.warning("gpu driver taken back", cards=len(fresh))
