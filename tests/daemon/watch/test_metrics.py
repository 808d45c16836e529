"""The metrics' pure parts: a snapshot's families, names, units and zero series."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.daemon.watch.metrics import Metrics, split_listen
from supervisor.daemon.watch.metrics_render import families
from supervisor.daemon.watch.metrics_snapshot import (
    LATENCY_BUCKETS,
    MIB,
    CardSample,
    HostSample,
    Snapshot,
)

CARD = CardSample(
    index=0,
    pci_bus_id="0000:01:00.0",
    name="Simulated GPU",
    vendor="simulated",
    driver_version="550.54.15",
    utilization_pct=50.0,
    vram_used_mb=1024,
    vram_total_mb=8192,
    healthy=True,
    running_jobs=1,
    uuid="GPU-5eed0000-0000-4000-8000-000000000000",
)
SNAP = Snapshot(
    jobs={"succeeded": 3, "running": 1},
    held={"host_ram": 2},
    attempt_failures={"gpu_hang": 1},
    hangs={("0", "0000:01:00.0", "535.0"): 1},
    cards=(CARD,),
    host=HostSample(
        limit_mb=1000,
        available_mb=900,
        reserve_mb=50,
        projected_mb=600,
        rss_mb=10,
        free_for_new_mb=-5,
    ),
    beats={"scheduler": 100.0, "server": 90.0, "loop": None},
    deadman_fires=2,
    problems=1,
)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


def render(snap: Snapshot) -> str:
    return Metrics().render(snap)


def test_jobs_holds_and_failures_have_a_series_for_every_known_value() -> None:
    text = render(SNAP)
    assert value(text, "gpusv_jobs", state="succeeded") == 3
    assert value(text, "gpusv_jobs", state="cancelled") == 0
    assert value(text, "gpusv_jobs_held", reason="host_ram") == 2
    assert value(text, "gpusv_jobs_held", reason="dependency") == 0
    assert value(text, "gpusv_attempt_failures_total", reason="gpu_hang") == 1
    assert value(text, "gpusv_attempt_failures_total", reason="oom_killed") == 0


def test_cards_in_base_units_and_hangs_keep_the_driver_of_their_time() -> None:
    text = render(SNAP)
    # dcgm-exporter's label names and bus id spelling, so that series join on a card
    card = {"gpu": "0", "UUID": CARD.uuid, "pci_bus_id": "00000000:01:00.0"}
    assert value(text, "gpusv_gpu_utilization_ratio", **card) == 0.5
    assert value(text, "gpusv_gpu_memory_used_bytes", **card) == 1024 * MIB
    assert value(text, "gpusv_gpu_memory_total_bytes", **card) == 8192 * MIB
    assert value(text, "gpusv_gpu_healthy", **card) == 1
    assert value(text, "gpusv_gpu_running_jobs", **card) == 1
    # the hang happened under 535.0; the card now runs 550.54.15, which starts at 0
    assert value(text, "gpusv_gpu_hangs_total", driver_version="535.0", **card) == 1
    assert value(text, "gpusv_gpu_hangs_total", driver_version="550.54.15", **card) == 0
    lost = dataclasses.replace(SNAP, cards=(dataclasses.replace(CARD, healthy=False),))
    assert value(render(lost), "gpusv_gpu_healthy", **card) == 0


def test_unknown_utilization_has_no_series_rather_than_zero() -> None:
    unknown = dataclasses.replace(SNAP, cards=(dataclasses.replace(CARD, utilization_pct=None),))
    names = {name for name, _ in samples(render(unknown))}
    assert "gpusv_gpu_utilization_ratio" not in names
    assert "gpusv_gpu_memory_used_bytes" in names


def test_host_ledger_in_bytes_may_go_negative() -> None:
    text = render(SNAP)
    assert value(text, "gpusv_host_memory_limit_bytes") == 1000 * MIB
    assert value(text, "gpusv_host_memory_projected_bytes") == 600 * MIB
    assert value(text, "gpusv_host_memory_free_for_new_bytes") == -5 * MIB
    assert ("gpusv_host_memory_limit_bytes", frozenset()) not in samples(render(Snapshot()))


def test_heartbeat_ages_are_taken_at_scrape_time() -> None:
    fams = {f.name: f for f in families(SNAP, now=110.0)}
    ages = {s.labels["service"]: s.value for s in fams["gpusv_heartbeat_age_seconds"].samples}
    assert ages == {"scheduler": 10.0, "server": 20.0}  # never beaten: no age yet
    assert fams["gpusv_watchdog_heartbeat_age_seconds"].samples[0].value == 20.0
    later = {f.name: f for f in families(SNAP, now=200.0)}
    assert later["gpusv_watchdog_heartbeat_age_seconds"].samples[0].value == 110.0


def test_daemon_gauges_and_counters() -> None:
    text = render(SNAP)
    assert value(text, "gpusv_deadman_fires_total") == 2
    assert value(text, "gpusv_node_healthy") == 0
    assert value(text, "gpusv_draining") == 0
    assert value(render(Snapshot()), "gpusv_node_healthy") == 1
    assert "_created" not in text


def test_listener_errors_are_counted_from_zero() -> None:
    assert (
        value(render(dataclasses.replace(SNAP, listener_errors=3)), "gpusv_listener_errors_total")
        == 3
    )
    assert value(render(Snapshot()), "gpusv_listener_errors_total") == 0  # there to alert on


def test_the_textfile_text_leaves_process_series_to_node_exporter() -> None:
    m = Metrics()
    assert "process_" not in m.render(SNAP)  # node_exporter refuses duplicate series
    scraped = generate_latest(m.registry).decode()
    assert "process_resident_memory_bytes" in scraped
    assert value(scraped, "gpusv_jobs", state="succeeded") == 3


def test_dispatch_latency_counts_first_starts_only() -> None:
    m = Metrics()
    spec = JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0)
    queued = Job(id=1, spec=spec, submitted_at="2000-01-01T00:00:00.000Z")
    first = dataclasses.replace(queued, state=JobState.RUNNING, attempts=1)
    retry = dataclasses.replace(first, attempts=2)
    progress = dataclasses.replace(first, progress="step 3")
    m.observe_job(queued, first)
    m.observe_job(queued, retry)  # a retry's wait is backoff, not dispatch
    m.observe_job(first, progress)  # not a state change
    m.observe_job(None, queued)
    text = generate_latest(m.registry).decode()
    assert value(text, "gpusv_dispatch_latency_seconds_count") == 1
    assert value(text, "gpusv_dispatch_latency_seconds_bucket", le="+Inf") == 1
    assert value(text, "gpusv_dispatch_latency_seconds_bucket", le="86400.0") == 0  # years ago


def test_dispatch_latency_is_the_histogram_prometheus_client_would_give() -> None:
    # The loop keeps plain counts (no prometheus_client before a render); the series must
    # be those of prometheus_client's own Histogram: bounds, edges (a value equal to a
    # bound is in that bucket), +Inf, count and sum.
    m = Metrics()
    theirs = CollectorRegistry()
    reference = Histogram(
        "gpusv_dispatch_latency_seconds",
        "Seconds from a job's submit to the start of its first attempt.",
        buckets=LATENCY_BUCKETS,
        registry=theirs,
    )
    seconds = [0.0, 0.01, 0.05, 0.050001, 1, 2.5, 7, 86400, 86401, 1e9, 0.3]
    for s in seconds:
        m.latency.observe(s)
        reference.observe(s)

    def series(text: str) -> list[str]:
        return [
            line
            for line in text.splitlines()
            if line.startswith("gpusv_dispatch_latency_seconds") and "_created" not in line
        ]

    ours = series(generate_latest(m.registry).decode())
    assert ours == series(generate_latest(theirs).decode())
    assert value("\n".join(ours), "gpusv_dispatch_latency_seconds_bucket", le="0.05") == 3
    assert value("\n".join(ours), "gpusv_dispatch_latency_seconds_count") == len(seconds)


def test_split_listen() -> None:
    assert split_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert split_listen("[::1]:9464") == ("::1", 9464)
    assert split_listen("0.0.0.0:1") == ("0.0.0.0", 1)
