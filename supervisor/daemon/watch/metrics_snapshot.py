"""The figures a metrics scrape shows, as plain frozen values: what the daemon gathers on
its loop (`metrics.py`) and what the Prometheus side renders (`metrics_render.py`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import get_args

from supervisor.core.admission import HoldReason

MIB = 1 << 20
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
    listener_errors: int = 0  # listeners of the daemon's events that raised since start


class Latency:
    """Submit -> first start, as a Prometheus histogram counts it: per bucket (upper
    bounds LATENCY_BUCKETS, then +Inf), the observations at most that bound and above
    the one before. `state` (counts, sum) is replaced whole at each observation, so a
    scrape on prometheus_client's thread reads counts and sum of the same moment."""

    def __init__(self) -> None:
        self.state: tuple[tuple[int, ...], float] = ((0,) * (len(LATENCY_BUCKETS) + 1), 0.0)

    def observe(self, seconds: float) -> None:
        counts, total = self.state
        i = bisect.bisect_left(LATENCY_BUCKETS, seconds)  # the first bound >= seconds
        self.state = ((*counts[:i], counts[i] + 1, *counts[i + 1 :]), total + seconds)
