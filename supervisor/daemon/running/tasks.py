"""The runner's tasks, one a job: plain asyncio tasks, held as a task group holds its
own. anyio's task group gives each task a cancel scope and an event of its own: 40 µs a
task here, on the path of every job's start; a plain task costs 10. The rules are the
task group's: a task that fails ends the whole (its error is raised where `run` waits),
and when the whole ends, every task is cancelled and waited for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio


class Tasks:
    def __init__(self) -> None:
        self._live: set[asyncio.Task[None]] = set()
        self._failed: BaseException | None = None  # the first task that failed
        self._fault = asyncio.Event()

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        task = asyncio.get_running_loop().create_task(fn(*args))
        self._live.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._live.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._failed = self._failed or exc
            self._fault.set()

    async def run(self) -> None:
        """Until a task fails (its error is raised here) or this is cancelled; either
        way every task is then cancelled, and waited for."""
        try:
            await self._fault.wait()
            assert self._failed is not None
            raise self._failed
        finally:
            with anyio.CancelScope(shield=True):
                while self._live:  # a task may start another while it is cancelled
                    live = list(self._live)
                    for task in live:
                        task.cancel()
                    await asyncio.wait(live)
