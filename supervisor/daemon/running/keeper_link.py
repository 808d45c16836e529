"""A keeper connection's life: how long a call may wait, whether a closed connection
means a dead keeper, and coming back to a keeper that still lives.

A closed connection is not a dead keeper. A keeper may close one (a line it could not
take from an older keeper, a buffer it could not send), or the socket may fail; its
jobs run on all the same. So a keeper counts as gone only once its process has exited
(its pidfd, opened when it was attached, polls readable). While it lives, gpusvd
connects again and attaches anew; the attach lists every record, and the jobs are
watched on as before, none of them `interrupted`.
"""

from __future__ import annotations

import os
import select
import time

import structlog

log = structlog.get_logger("gpusvd.keepers")

CALL_DEADLINE_S = 10.0  # a keeper answers in milliseconds; this much is a keeper stuck
RECONNECT_S = 10.0  # how long a keeper that lives but does not accept is tried again
RECONNECT_FIRST_S = 0.02


def open_pidfd(pid: int) -> int | None:
    """A pidfd of the keeper just attached (its pid from the attach's answer)."""
    if pid <= 0:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def process_alive(pidfd: int | None) -> bool:
    """Whether the keeper process still runs: a pidfd polls readable once it exits.
    Without one (an older kernel, or it could not be opened) a connection lost is taken
    for a keeper lost, as before."""
    if pidfd is None:
        return False
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def deadline_for(op: str, fields: dict[str, object]) -> float:
    """How long a call may wait for its answer: a kill waits for its grace as well."""
    grace = fields.get("grace_s") if op == "kill" else 0.0
    return CALL_DEADLINE_S + (float(grace) if isinstance(grace, (int, float)) else 0.0)


def keeper_stuck(name: str, op: str, waited_s: float, *, still_waiting: bool) -> None:
    """A keeper did not answer in time. Said at `error`; what else is done about a stuck
    keeper (a probe, a restart of it) belongs here. A spawn goes on waiting: its job may
    have started, and a start's outcome must be known before anything else is decided;
    any other call has failed."""
    log.error(
        "keeper stuck: no answer in time",
        keeper=name,
        op=op,
        waited_s=round(waited_s, 1),
        still_waiting=still_waiting,
    )


class Backoff:
    """The pauses between attempts to reach a keeper again, up to a total."""

    def __init__(self, total_s: float = RECONNECT_S) -> None:
        self.until = time.monotonic() + total_s
        self.pause = RECONNECT_FIRST_S

    def next(self) -> float | None:
        """The pause before the next attempt; None once the total is spent."""
        if time.monotonic() >= self.until:
            return None
        pause, self.pause = self.pause, min(1.0, self.pause * 2)
        return pause
