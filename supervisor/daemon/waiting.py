"""Requests waiting for jobs' ends (`wait`, `submit --wait`), woken by the engine's
Changed events. The end comes with the wake-up, as the engine published it: a waiter for
a thousand jobs reads none of them back from the store."""

from __future__ import annotations

import anyio

from supervisor.core.jobs import Job


class Ends:
    def __init__(self) -> None:
        self._waiting: dict[int, list[anyio.Event]] = {}
        self._ended: dict[int, Job] = {}  # kept only until its waiter takes it

    def changed(self, job: Job) -> None:
        """A job reached a terminal state (committed): wake whoever waits for it."""
        waiting = self._waiting.pop(job.id, None)
        if waiting:
            self._ended[job.id] = job
            for event in waiting:
                event.set()

    async def until_ended(self, job_id: int) -> Job | None:
        """Wait for the job's end: the job as published, or None where another waiter of
        the same job took it (read it from the store then). Woken or given up (a
        timeout), nothing of this wait is left behind."""
        event = anyio.Event()
        self._waiting.setdefault(job_id, []).append(event)
        try:
            await event.wait()
        finally:
            waiting = self._waiting.get(job_id, [])
            if event in waiting:
                waiting.remove(event)
            if not waiting:
                self._waiting.pop(job_id, None)
            ended = self._ended.pop(job_id, None)
        return ended
