"""Prometheus metrics: a snapshot of the daemon's figures, the collector that renders it,
and the opt-in HTTP endpoint (`metrics_listen`).

prometheus_client answers scrapes on its own thread, so the collector never touches live
daemon state: the event loop gathers a plain `Snapshot` (after each job state change, at
most once a second, and every few seconds regardless) and swaps it in whole; a scrape
renders whichever snapshot is current. Heartbeat ages are computed at scrape time from
monotonic stamps, so a stalled event loop shows as a growing age, not a frozen one.
`gpusv metrics` renders a fresh snapshot on the loop through the same collectors.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import get_args
from wsgiref.simple_server import WSGIServer

import anyio
import anyio.abc
import anyio.to_thread
import structlog
from prometheus_client import (
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.core.admission import HoldReason
from supervisor.core.jobs import FailureReason, Job, JobState
from supervisor.daemon.clock import epoch_from_iso
from supervisor.gpus.base import dcgm_bus_id

log = structlog.get_logger("gpusvd.metrics")

MIB = 1 << 20
REFRESH_S = 5.0  # the longest a scraped figure can lag (card readings, holds, hang records)
SETTLE_S = 1.0  # a burst of state changes costs one snapshot per this many seconds
# Submit -> exec: from an idle box (well under a second) to a day-long queue.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400)
HOLD_REASONS = (*get_args(HoldReason), "dependency")
# dcgm-exporter's names and spellings (UUID, an 8-digit-domain pci_bus_id), so that series
# from both join on a card.
CARD_LABELS = ["gpu", "UUID", "pci_bus_id"]


@dataclass(frozen=True)
class CardSample:
    index: int
    pci_bus_id: str
    name: str
    vendor: str
    driver_version: str
    utilization_pct: float | None  # None: the card cannot tell; no series then
    vram_used_mb: int
    vram_total_mb: int
    healthy: bool
    running_jobs: int
    uuid: str = ""


@dataclass(frozen=True)
class HostSample:
    """The host-RAM ledger, in MiB, as admission sees it."""

    limit_mb: int
    available_mb: int
    reserve_mb: int
    projected_mb: int  # running jobs: projected peak, or RSS where there is no projection
    rss_mb: int
    free_for_new_mb: int


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape shows, as plain values; replaced whole, never changed."""

    jobs: Mapping[str, int] = field(default_factory=dict)  # by state
    held: Mapping[str, int] = field(default_factory=dict)  # queued jobs held, by reason
    attempt_failures: Mapping[str, int] = field(default_factory=dict)  # by reason
    hangs: Mapping[tuple[str, str, str], int] = field(default_factory=dict)  # (gpu, bus, driver)
    cards: tuple[CardSample, ...] = ()
    host: HostSample | None = None
    beats: Mapping[str, float | None] = field(default_factory=dict)  # service -> monotonic
    deadman_fires: int = 0
    problems: int = 0  # what `gpusv health` would list
    draining: bool = False
    storage_ok: bool = True  # the state database takes writes
    storage_failures: int = 0  # commits that failed for the storage since start


def _zeros(known: Iterable[str], counts: Mapping[str, int]) -> dict[str, int]:
    """Every known label value gets a series, so that rate() and alerts see a 0, not absence."""
    return {**dict.fromkeys(known, 0), **counts}


def job_families(snap: Snapshot) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("gpusv_jobs", "Jobs by state.", labels=["state"])
    for state, n in sorted(_zeros((s.value for s in JobState), snap.jobs).items()):
        jobs.add_metric([state], n)
    held = GaugeMetricFamily(
        "gpusv_jobs_held",
        "Queued jobs held back, by reason (host_ram, vram, gpus, cpu, array, dependency).",
        labels=["reason"],
    )
    for reason, n in sorted(_zeros(HOLD_REASONS, snap.held).items()):
        held.add_metric([reason], n)
    failures = CounterMetricFamily(
        "gpusv_attempt_failures",
        "Attempts that ended without success, by reason.",
        labels=["reason"],
    )
    for reason, n in sorted(
        _zeros((r.value for r in FailureReason), snap.attempt_failures).items()
    ):
        failures.add_metric([reason], n)
    yield from (jobs, held, failures)


def card_families(
    cards: tuple[CardSample, ...], hangs: Mapping[tuple[str, str, str], int]
) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "gpusv_gpu_info",
        "One series per card, value 1, naming it.",
        labels=[*CARD_LABELS, "name", "vendor", "driver_version"],
    )
    gauges = {
        "healthy": GaugeMetricFamily(
            "gpusv_gpu_healthy", "1 when the card answers, 0 when it is lost.", labels=CARD_LABELS
        ),
        "util": GaugeMetricFamily(
            "gpusv_gpu_utilization_ratio", "GPU utilization, 0 to 1.", labels=CARD_LABELS
        ),
        "used": GaugeMetricFamily(
            "gpusv_gpu_memory_used_bytes", "VRAM in use.", labels=CARD_LABELS
        ),
        "total": GaugeMetricFamily("gpusv_gpu_memory_total_bytes", "VRAM.", labels=CARD_LABELS),
        "jobs": GaugeMetricFamily(
            "gpusv_gpu_running_jobs", "Jobs running on the card.", labels=CARD_LABELS
        ),
    }
    uuids = {str(c.index): c.uuid for c in cards}
    counts = {(g, uuids.get(g, ""), dcgm_bus_id(bus), drv): n for (g, bus, drv), n in hangs.items()}
    for c in cards:
        gpu, uuid, bus = str(c.index), c.uuid, dcgm_bus_id(c.pci_bus_id)
        labels = [gpu, uuid, bus]
        info.add_metric([*labels, c.name, c.vendor, c.driver_version], 1)
        gauges["healthy"].add_metric(labels, int(c.healthy))
        if c.utilization_pct is not None:
            gauges["util"].add_metric(labels, c.utilization_pct / 100)
        gauges["used"].add_metric(labels, c.vram_used_mb * MIB)
        gauges["total"].add_metric(labels, c.vram_total_mb * MIB)
        gauges["jobs"].add_metric(labels, c.running_jobs)
        counts.setdefault((gpu, uuid, bus, c.driver_version), 0)
    hang_family = CounterMetricFamily(
        "gpusv_gpu_hangs",
        "Attempts failed as gpu_hang, by card and the driver version at the time.",
        labels=[*CARD_LABELS, "driver_version"],
    )
    for key, n in sorted(counts.items()):
        hang_family.add_metric(list(key), n)
    yield from (info, *gauges.values(), hang_family)


def host_families(host: HostSample | None) -> Iterator[Metric]:
    if host is None:
        return
    figures = (
        ("limit", "Most RAM that jobs together may use ([host_memory] limit).", host.limit_mb),
        ("available", "MemAvailable.", host.available_mb),
        ("reserve", "RAM kept free for the system ([host_memory] reserve).", host.reserve_mb),
        (
            "projected",
            "Sum over running jobs of the projected peak RSS (RSS where none is known).",
            host.projected_mb,
        ),
        ("jobs_rss", "Sum of the running jobs' RSS now.", host.rss_mb),
        (
            "free_for_new",
            "RAM a new job may still take; negative when overbooked.",
            host.free_for_new_mb,
        ),
    )
    for name, doc, mb in figures:
        yield GaugeMetricFamily(f"gpusv_host_memory_{name}_bytes", doc, value=mb * MIB)


def daemon_families(snap: Snapshot, now: float) -> Iterator[Metric]:
    ages = {name: now - last for name, last in snap.beats.items() if last is not None}
    per_service = GaugeMetricFamily(
        "gpusv_heartbeat_age_seconds",
        "Seconds since each watched service last checked in.",
        labels=["service"],
    )
    for name, age in sorted(ages.items()):
        per_service.add_metric([name], age)
    yield per_service
    if ages:
        yield GaugeMetricFamily(
            "gpusv_watchdog_heartbeat_age_seconds",
            "Seconds since the least recent check-in of the services that gate WATCHDOG=1.",
            value=max(ages.values()),
        )
    yield CounterMetricFamily(
        "gpusv_deadman_fires",
        "Times the deadman exited the daemon (70) because an abort did not return.",
        value=snap.deadman_fires,
    )
    yield GaugeMetricFamily(
        "gpusv_draining", "1 while the daemon drains.", value=int(snap.draining)
    )
    yield GaugeMetricFamily(
        "gpusv_storage_writable",
        "1 while the state database takes writes; 0: no job starts until it does.",
        value=int(snap.storage_ok),
    )
    yield CounterMetricFamily(
        "gpusv_storage_write_failures",
        "Commits of the state database that failed (disk full, read-only, I/O error).",
        value=snap.storage_failures,
    )
    yield GaugeMetricFamily(
        "gpusv_node_healthy",
        "1 when `gpusv health` would exit 0.",
        value=int(snap.problems == 0),
    )


def families(snap: Snapshot, now: float) -> list[Metric]:
    """Every metric of a snapshot; `now` is time.monotonic() at the scrape."""
    return [
        *job_families(snap),
        *card_families(snap.cards, snap.hangs),
        *host_families(snap.host),
        *daemon_families(snap, now),
    ]


class SnapshotCollector(Collector):
    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> list[Metric]:
        return families(self.snapshot, time.monotonic())


def split_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:9464' -> ('127.0.0.1', 9464); '[::1]:9464' -> ('::1', 9464)."""
    host, _, port = listen.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _stop(httpd: WSGIServer) -> None:
    httpd.shutdown()
    httpd.server_close()


class Metrics:
    """Two registries over the same collectors. `gpusv metrics` renders `text`: the
    gpusv_* series only, since node_exporter, which reads it as a textfile, exports
    process_* series of its own and refuses duplicates. HTTP scrapes get `registry`:
    the same plus the daemon's own process_* series (CPU, memory, open files)."""

    def __init__(self) -> None:
        # `_created` series say when a counter started; the process start time says it
        # once, and textfile collectors would only carry the noise.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.text = CollectorRegistry()
        self.collector = SnapshotCollector()
        self.latency = Histogram(
            "gpusv_dispatch_latency_seconds",
            "Seconds from a job's submit to the start of its first attempt.",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.registry = CollectorRegistry()
        for registry in (self.text, self.registry):
            registry.register(self.collector)
            registry.register(self.latency)
        ProcessCollector(registry=self.registry)
        self._changed: anyio.Event | None = None

    def observe_job(self, old: Job | None, new: Job) -> None:
        """Told of every job change: time first dispatches, and refresh after state changes."""
        if old is None or old.state is new.state:
            return
        if self._changed is not None:
            self._changed.set()
        first_start = old.state is JobState.QUEUED and new.state is JobState.RUNNING
        if first_start and new.attempts == 1 and new.submitted_at:
            self.latency.observe(max(0.0, time.time() - epoch_from_iso(new.submitted_at)))

    def render(self, snapshot: Snapshot) -> str:
        """The text format (version 0.0.4), from `snapshot`, which becomes the current one."""
        self.collector.snapshot = snapshot
        return generate_latest(self.text).decode()

    async def serve(
        self,
        listen: str,
        gather: Callable[[], Awaitable[Snapshot]],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve http://LISTEN/metrics until cancelled. A port that cannot be bound is
        logged and leaves the daemon running: metrics are never worth an outage."""
        self._changed = anyio.Event()
        await self._refresh(gather)
        host, port = split_listen(listen)
        try:
            # Off the loop: the address may need a resolver.
            httpd, _thread = await anyio.to_thread.run_sync(
                lambda: start_http_server(port, host, registry=self.registry)
            )
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
                await anyio.to_thread.run_sync(_stop, httpd)

    async def _refresh(self, gather: Callable[[], Awaitable[Snapshot]]) -> None:
        try:
            self.collector.snapshot = await gather()
        except Exception as exc:  # a metrics bug must not take the daemon down
            log.warning("metrics snapshot failed; serving the previous one", error=repr(exc))
