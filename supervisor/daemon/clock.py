"""Time: wall-clock stamps for records, monotonic time for every duration."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_from_epoch(epoch: float) -> str:
    stamp = datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def epoch_from_iso(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


monotonic = time.monotonic
