"""Time: wall-clock stamps for records, monotonic time for every duration."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from supervisor.core.records import iso_at


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_from_epoch(epoch: float) -> str:
    return iso_at(epoch)


def epoch_from_iso(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


monotonic = time.monotonic
