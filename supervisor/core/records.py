"""The records of a job's history: its attempts and its events. Plain data, no I/O."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_second = (0, "1970-01-01T00:00:00")  # the last second stamped, formatted


def iso_at(wall: float) -> str:
    """Epoch seconds as the records' stamp: UTC, milliseconds, `Z`; the same string as
    `datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")` gives (which
    rounds to the microsecond, half to even, then cuts). A job's life stamps several
    rows within one second: that second is formatted once."""
    global _second
    sec = math.floor(wall)
    us = round((wall - sec) * 1e6)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    if sec != _second[0]:
        _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return f"{_second[1]}.{us // 1000:03d}Z"


def epoch_of(stamp: str) -> float:
    """A records' stamp back to epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Attempt:
    job_id: int
    n: int
    gpus: tuple[int, ...]
    started_at: str
    mem_key: str
    mem_scale: float | None = None
    pid: int | None = None
    pid_start: float | None = None
    ended_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    peak_rss_mb: int | None = None
    peak_vram_mb: int | None = None
    evidence: dict[str, Any] | None = None
    gpu_uuids: tuple[str, ...] = ()
    # Why the daemon is stopping it and since when (its first signal), committed before
    # the stop is acted on or acknowledged: a restart carries the stop through.
    stop_reason: str | None = None
    stop_at: str | None = None
    stop_evidence: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "gpus": list(self.gpus),
            "gpu_uuids": list(self.gpu_uuids),
            "pid": self.pid,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "peak_rss_mb": self.peak_rss_mb,
            "peak_vram_mb": self.peak_vram_mb,
            "evidence": self.evidence,
            "stopping": self.stop_reason if self.ended_at is None else None,
        }


@dataclass(frozen=True)
class Event:
    kind: str
    message: str
    data: dict[str, Any] | None = None
