"""The log lines of the engine's events: every one that matters, and routine ones only up
to a rate.

A job's routine lines (submitted, waiting, started, succeeded) are logged at most
`per_s` a second; past that, they are counted, and one line a second later says how many
of each kind were left out. Each of them is in its job's events (`gpusv show`), and
the cap is what keeps a flood of short jobs (two lines each, hundreds a second) from
filling the journal, whose own rate limit would then drop the daemon's warnings and
errors with them. Every other event line (a failure, a retry, a hang, an OOM kill, a
cancel, an interruption) is always logged. Within one commit, past its first
`PER_COMMIT` lines, one line tells how many more there were.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from supervisor.core.commands import InsertJob, SaveJob, Write
from supervisor.core.jobs import Job, JobState
from supervisor.core.records import Event

log = structlog.get_logger("gpusvd.events")

PER_COMMIT = 10  # event lines per commit; a big batch gets one line more
DEFAULT_PER_S = 20
WINDOW_S = 1.0
_ROUTINE = frozenset({"submitted", "queue_wait", "started"})
_MACHINE_REASONS = frozenset({"oom_killed", "spawn_failed", "spawn_retry"})


def routine(kind: str, job: Job | None) -> bool:
    """A line that only tells things went as planned: a job submitted, waiting, started,
    or ended in success."""
    if kind in _ROUTINE:
        return True
    return kind == "exited" and job is not None and job.state is JobState.SUCCEEDED


def warns(kind: str, reason: str | None) -> bool:
    """A line an operator must see (`journalctl -p warning`): a GPU hang, output the disk
    refused, and an attempt that ended for the machine's sake (OOM-killed, or never
    started), not the job's."""
    if kind in ("gpu_hang", "output_dropped"):
        return True
    return kind == "exited" and reason in _MACHINE_REASONS


def about(w: SaveJob, ev: Event) -> dict[str, Any]:
    """An event line's keys: its kind, its job and, where the write has one, the attempt
    (its number, cards and their UUIDs) and the reason; under journald these become the
    entry's GPUSV_* fields (life/journal.py)."""
    keys: dict[str, Any] = {"event_kind": ev.kind, "job_id": w.job.id, "state": w.job.state.value}
    attempt = w.ended_attempt or w.new_attempt
    if attempt is not None:
        keys["attempt"] = attempt.n
        keys["gpus"] = list(attempt.gpus)
        if attempt.gpu_uuids:
            keys["gpu_uuids"] = list(attempt.gpu_uuids)
    reason = (ev.data or {}).get("reason") or (attempt.reason if attempt else None)
    if reason:
        keys["reason"] = str(reason)
    return keys


class JobLines:
    """Logs the events of the engine's writes once they are committed."""

    def __init__(self, per_s: int = DEFAULT_PER_S, clock: Callable[[], float] = time.monotonic):
        self.per_s = per_s  # 0: every routine line is logged
        self.clock = clock
        self._window = -WINDOW_S  # when the current second began
        self._used = 0  # routine lines logged in it
        self._left_out: Counter[str] = Counter()
        self._timer: asyncio.TimerHandle | None = None

    def reconfigure(self, per_s: int) -> None:
        self.per_s = per_s

    def log(self, writes: Sequence[Write]) -> None:
        inserts = [w for w in writes if isinstance(w, InsertJob)]
        if inserts and self._take("submitted"):
            if len(inserts) <= PER_COMMIT:
                for w in inserts:
                    log.info("submitted", event_kind="submitted", job_id=w.job.id, state="queued")
            else:
                ids = f"{inserts[0].job.id}-{inserts[-1].job.id}"
                log.info("submitted", event_kind="submitted", job_ids=ids)
        lines: list[tuple[SaveJob, Event]] = [
            (w, ev) for w in writes if isinstance(w, SaveJob) for ev in w.events
        ]
        shown, more = 0, 0
        for save, ev in lines:
            if routine(ev.kind, save.job) and not self._take(ev.kind):
                continue
            if shown == PER_COMMIT:
                more += 1
                continue
            shown += 1
            keys = about(save, ev)
            if warns(ev.kind, keys.get("reason")):
                log.warning(ev.message, **keys)
            else:
                log.info(ev.message, **keys)
        if more:
            log.info(f"and {more} more", event_kind=lines[-1][1].kind)

    def _take(self, kind: str) -> bool:
        """Whether a routine line of `kind` may be logged now; else it is counted."""
        if self.per_s <= 0:
            return True
        now = self.clock()
        if now - self._window >= WINDOW_S:
            self.flush()
            self._window, self._used = now, 0
        if self._used < self.per_s:
            self._used += 1
            return True
        self._left_out[kind] += 1
        if self._timer is None:
            self._timer = _later(self._window + WINDOW_S - now, self.flush)
        return False

    def flush(self) -> None:
        """The line that tells what the last second left out, if it left out any."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._left_out:
            return
        counts, self._left_out = dict(self._left_out), Counter()
        log.info(
            "routine job lines left out; each is in its job's `gpusv show`",
            event_kind="left_out",
            left_out=sum(counts.values()),
            per_s=self.per_s,
            **counts,
        )


def _later(delay: float, call: Callable[[], None]) -> asyncio.TimerHandle | None:
    """`call` after `delay` on the running loop; outside one (a test's plain call), the
    next line's turn flushes instead."""
    try:
        return asyncio.get_running_loop().call_later(max(0.0, delay), call)
    except RuntimeError:
        return None
