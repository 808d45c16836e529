"""The Prometheus side of the metrics: a snapshot's families, the collector that renders
it, the registries and the HTTP server. `metrics.Metrics` imports this module at first use:
prometheus_client brings http.server, wsgiref, email and urllib with it (~3 MiB) that an
idle daemon, never scraped, has no use for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from supervisor.core.jobs import FailureReason, JobState
from supervisor.daemon.watch.metrics_snapshot import (
    CARD_LABELS,
    HOLD_REASONS,
    LATENCY_BUCKETS,
    MIB,
    CardSample,
    HostSample,
    Latency,
    Snapshot,
)
from supervisor.gpus.base import dcgm_bus_id


def _zeros(known: Iterable[str], counts: Mapping[str, int]) -> dict[str, int]:
    """Every known label value gets a series, so that rate() and alerts see a 0, not absence."""
    return {**dict.fromkeys(known, 0), **counts}


def job_families(snap: Snapshot) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("gpusv_jobs", "Jobs by state.", labels=["state"])
    for state, n in sorted(_zeros((s.value for s in JobState), snap.jobs).items()):
        jobs.add_metric([state], n)
    held = GaugeMetricFamily(
        "gpusv_jobs_held",
        "Queued jobs held back, by reason (host_ram, vram, gpus, cpu, array, cards, dependency).",
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
    yield CounterMetricFamily(
        "gpusv_listener_errors",
        "Listeners of the daemon's events that raised; each is logged with its event type.",
        value=snap.listener_errors,
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


class LatencyCollector(Collector):
    """The dispatch latency histogram, from the counts the loop keeps (metrics.Latency):
    the series prometheus_client's own Histogram would give for the same observations."""

    def __init__(self, latency: Latency) -> None:
        self.latency = latency

    def collect(self) -> list[Metric]:
        counts, total = self.latency.state
        bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
        cumulative, running = [], 0
        for bound, n in zip(bounds, counts, strict=True):
            running += n
            cumulative.append((bound, running))
        family = HistogramMetricFamily(
            "gpusv_dispatch_latency_seconds",
            "Seconds from a job's submit to the start of its first attempt.",
            buckets=cumulative,
            sum_value=total,
        )
        return [family]


class Registries:
    """Two registries over the same collectors. `gpusv metrics` renders `text`: the
    gpusv_* series only, since node_exporter, which reads it as a textfile, exports
    process_* series of its own and refuses duplicates. HTTP scrapes get `registry`:
    the same plus the daemon's own process_* series (CPU, memory, open files)."""

    def __init__(self, latency: Latency) -> None:
        # `_created` series say when a counter started; the process start time says it
        # once, and textfile collectors would only carry the noise.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.text = CollectorRegistry()
        self.collector = SnapshotCollector()
        self.latency = LatencyCollector(latency)
        self.registry = CollectorRegistry()
        for registry in (self.text, self.registry):
            registry.register(self.collector)
            registry.register(self.latency)
        ProcessCollector(registry=self.registry)

    def render(self) -> str:
        """The text format (version 0.0.4) of the current snapshot."""
        return generate_latest(self.text).decode()

    def listen(self, host: str, port: int) -> WSGIServer:
        """Serve `registry` on http://HOST:PORT/metrics from prometheus_client's thread."""
        httpd, _thread = start_http_server(port, host, registry=self.registry)
        return httpd


def stop(httpd: WSGIServer) -> None:
    httpd.shutdown()
    httpd.server_close()
