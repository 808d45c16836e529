"""Requests waiting for jobs' ends (`wait`, `submit --wait`), woken by the engine's
Changed events. A request watches all of its jobs from its start, and each end comes
with the wake-up, as the engine published it: a waiter for a thousand jobs, which end
while it still waits for the first, reads none of them back from the store."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import anyio

from supervisor.core.jobs import Job


class Watch:
    """One request's jobs: those ended since it began are kept here until it takes them."""

    def __init__(self, ends: Ends) -> None:
        self._ends = ends
        self.ids: set[int] = set()
        self.ended: dict[int, Job] = {}
        self._woken = anyio.Event()

    def add(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            if job_id not in self.ids:
                self.ids.add(job_id)
                self._ends._watches.setdefault(job_id, []).append(self)

    def _ended(self, job: Job) -> None:
        self.ended[job.id] = job
        self._woken.set()

    async def until_ended(self, job_id: int) -> Job:
        """The job as the engine published its end (at once, if it has ended already)."""
        self.add((job_id,))
        while job_id not in self.ended:
            self._woken = anyio.Event()
            await self._woken.wait()
        return self.ended.pop(job_id)


class Ends:
    def __init__(self) -> None:
        self._watches: dict[int, list[Watch]] = {}

    def changed(self, job: Job) -> None:
        """A job reached a terminal state (committed): hand it to whoever watches it."""
        for watch in self._watches.pop(job.id, ()):
            watch.ids.discard(job.id)
            watch._ended(job)

    @contextmanager
    def watching(self, job_ids: Iterable[int] = ()) -> Iterator[Watch]:
        """Watch these jobs (more may be added) until the block is left, however it is
        left: nothing of the watch stays behind."""
        watch = Watch(self)
        watch.add(job_ids)
        try:
            yield watch
        finally:
            for job_id in watch.ids:
                others = [w for w in self._watches.get(job_id, ()) if w is not watch]
                if others:
                    self._watches[job_id] = others
                else:
                    self._watches.pop(job_id, None)
