"""Letting go of the driver at exit: nvmlShutdown, so that the next holder (a reset, a MIG
change, another gpusvd) finds NVML released."""

from __future__ import annotations

import anyio
import anyio.to_thread
import structlog

from supervisor.gpus.base import GpuBackend

log = structlog.get_logger(__name__)
CLOSE_DEADLINE_S = 5.0


async def release_backend(backend: GpuBackend, deadline_s: float = CLOSE_DEADLINE_S) -> None:
    """backend.close() on a worker thread; a driver wedged on a sick card may never return
    from it, and the daemon must still exit."""
    with anyio.move_on_after(deadline_s) as scope:
        await anyio.to_thread.run_sync(backend.close, abandon_on_cancel=True)
    if scope.cancelled_caught:
        log.warning("the GPU driver did not let go within the deadline", deadline_s=deadline_s)
