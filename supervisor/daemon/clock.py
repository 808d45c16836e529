"""Time: wall-clock stamps for records, monotonic time for every duration."""

from __future__ import annotations

import time

from supervisor.core.records import epoch_of, iso_at


def now_iso() -> str:
    return iso_at(time.time())


iso_from_epoch = iso_at  # the records' stamp, one format for all (core/records.py)


epoch_from_iso = epoch_of


monotonic = time.monotonic
