"""Time: wall-clock stamps for records, monotonic time for every duration."""

from __future__ import annotations

import time
from datetime import datetime

from supervisor.core.records import iso_at


def now_iso() -> str:
    return iso_at(time.time())


iso_from_epoch = iso_at  # the records' stamp, one format for all (core/records.py)


def epoch_from_iso(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


monotonic = time.monotonic
