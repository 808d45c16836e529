"""Prometheus metrics: a snapshot of the daemon's figures, the collector that renders it,
and the opt-in HTTP endpoint (`metrics_listen`).

prometheus_client answers scrapes on its own thread, so the collector never touches live
daemon state: the event loop gathers a plain `Snapshot` (after each job state change, at
most once a second, and every few seconds regardless) and swaps it in whole; a scrape
renders whichever snapshot is current. Heartbeat ages are computed at scrape time from
monotonic stamps, so a stalled event loop shows as a growing age, not a frozen one.
`gpusv metrics` renders a fresh snapshot on the loop through the same collectors.

prometheus_client is used through `metrics_render`, imported when a first figure is
wanted (a render, the endpoint): a daemon nobody scrapes does not carry it, and its
first job does not pay for its import (some 40 ms of CPU here). Timing a dispatch needs
none of it: the latency histogram's counts are plain integers here, which the render
turns into series.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.to_thread
import structlog

from supervisor.core.jobs import Job, JobState
from supervisor.daemon.clock import epoch_from_iso
from supervisor.daemon.watch.metrics_snapshot import (
    Latency,
    Snapshot,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from supervisor.daemon.watch.metrics_render import Registries

log = structlog.get_logger("gpusvd.metrics")

REFRESH_S = 5.0  # the longest a scraped figure can lag (card readings, holds, hang records)
SETTLE_S = 1.0  # a burst of state changes costs one snapshot per this many seconds


def split_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:9464' -> ('127.0.0.1', 9464); '[::1]:9464' -> ('::1', 9464)."""
    host, _, port = listen.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


class Metrics:
    """The daemon's metrics: `render` for `gpusv metrics`, `serve` for the endpoint, and
    `observe_job` told of every job change. The registries (see metrics_render.Registries)
    are built at the first of these that needs one."""

    def __init__(self) -> None:
        self._registries: Registries | None = None
        self._changed: anyio.Event | None = None
        self.latency = Latency()

    @property
    def registries(self) -> Registries:
        if self._registries is None:
            from supervisor.daemon.watch.metrics_render import Registries

            self._registries = Registries(self.latency)
        return self._registries

    @property
    def registry(self) -> CollectorRegistry:
        """What HTTP scrapes read: the gpusv_* series and the daemon's process_* series."""
        return self.registries.registry

    def observe_job(self, old: Job | None, new: Job) -> None:
        """Told of every job change: time first dispatches, and refresh after state changes."""
        if old is None or old.state is new.state:
            return
        if self._changed is not None:
            self._changed.set()
        first_start = old.state is JobState.QUEUED and new.state is JobState.RUNNING
        if first_start and new.attempts == 1 and new.submitted_at:
            latency = max(0.0, time.time() - epoch_from_iso(new.submitted_at))
            self.latency.observe(latency)

    def render(self, snapshot: Snapshot) -> str:
        """The text format (version 0.0.4), from `snapshot`, which becomes the current one."""
        self.registries.collector.snapshot = snapshot
        return self.registries.render()

    async def serve(
        self,
        listen: str,
        gather: Callable[[], Awaitable[Snapshot]],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve http://LISTEN/metrics until cancelled. A port that cannot be bound is
        logged and leaves the daemon running: metrics are never worth an outage."""
        from supervisor.daemon.watch.metrics_render import stop

        self._changed = anyio.Event()
        await self._refresh(gather)
        host, port = split_listen(listen)
        try:
            # Off the loop: the address may need a resolver.
            httpd = await anyio.to_thread.run_sync(self.registries.listen, host, port)
        except OSError as exc:
            log.error("metrics not served: cannot listen", listen=listen, error=str(exc))
            task_status.started()
            return
        log.info("serving metrics", url=f"http://{listen}/metrics")
        try:
            task_status.started()
            while True:
                with anyio.move_on_after(REFRESH_S):
                    await self._changed.wait()
                self._changed = anyio.Event()
                await self._refresh(gather)
                await anyio.sleep(SETTLE_S)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(stop, httpd)

    async def _refresh(self, gather: Callable[[], Awaitable[Snapshot]]) -> None:
        try:
            self.registries.collector.snapshot = await gather()
        except Exception as exc:  # a metrics bug must not take the daemon down
            log.warning("metrics snapshot failed; serving the previous one", error=repr(exc))
