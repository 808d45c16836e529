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

if TYPE_CHECKING:
    from supervisor.daemon.watch.gpu_monitor import GpuMonitor


async def handover_signals(monitor: GpuMonitor) -> None:
    with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                await monitor.release_driver()
            else:
                await monitor.reacquire_driver()
