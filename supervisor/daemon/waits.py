"""The `queue_wait` events a dispatch pass leaves for later passes to write.

A pass that claims a few jobs and holds many (a batch's first pass on idle cards: two
claims, a thousand holds) commits its claims without the holds' rows: the held jobs show
their wait and are settled at once, in the table, and their `queue_wait` events (with
their rows' `waiting_for`) are written by the passes that follow, a chunk a turn, after
those passes have claimed the lines ahead. Written with the claims, a thousand of them
(about 25 ms of SQLite) held back the claims' commit, and with it the batch's first
starts and the claims ahead behind them. A job claimed, ended or held anew meanwhile is
not announced here (it needs none, or has had its own). A daemon that dies before they
are written leaves those waits without an event; the next one holds the jobs again and
announces them then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from supervisor.core.admission import Hold
from supervisor.core.commands import Dispatch
from supervisor.core.jobs import JobState
from supervisor.daemon.engine import Engine

AT_ONCE = 256  # holds announced in one engine turn: a few ms of SQLite, not tens
AFTER_S = 0.05  # a pass that left some to write is followed this soon at the latest


class Waits:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = engine.table
        self._later: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._later)

    def leave(self, claims: int, holds: Sequence[Hold]) -> bool:
        """Whether a pass's holds are left for later (a pass that claims and holds more
        than a turn's worth); if so, they are remembered."""
        if not claims or len(holds) <= AT_ONCE:
            return False
        self._later.extend(h.job_id for h in holds)
        return True

    async def after_pass(self, claimed: bool, backoff: float | None) -> float | None:
        """Once a pass has claimed the lines ahead (one that claimed jobs has not: the
        next one does), the waits left for later are written; returns when the next pass
        is due: when the next backoff ends, or soon while some are left."""
        if not claimed:
            await self.announce()
        return min(backoff or AFTER_S, AFTER_S) if self._later else backoff

    async def announce(self) -> None:
        """Write the waits left for later (a turn a chunk: the commands that come
        meanwhile, a job's start or end, are taken between them)."""
        for holds in self.due():
            await self.engine.do(Dispatch((), holds))

    def due(self) -> Iterator[tuple[Hold, ...]]:
        """The waits left for later, a turn's worth at a time, each as its job shows it
        when its chunk is taken (read between the turns, not before the first)."""
        while self._later:
            chunk = [self._later.popleft() for _ in range(min(AT_ONCE, len(self._later)))]
            holds = tuple(hold for job_id in chunk if (hold := self._shown(job_id)) is not None)
            if holds:
                yield holds

    def _shown(self, job_id: int) -> Hold | None:
        job = self.table.jobs.get(job_id)
        if job is None or job.state is not JobState.QUEUED or job_id in self.table.announced:
            return None
        if job.waiting_for is None or job.hold_reason is None:
            return None
        return Hold(job_id, job.hold_reason, job.waiting_for)  # type: ignore[arg-type]
