"""The abort deadman: a wedged abort becomes an exit (70) and a restart, never an outage.

Every call that may block forever (an NVML query of a hung GPU, killing a process tree
stuck in D state) runs on its own named thread. One watcher thread, which needs nothing
from the event loop, holds their deadlines; when one passes with the call still running,
it writes forensics and calls `os._exit(70)`, and systemd restarts the daemon.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NoReturn, TypeVar

import anyio
import anyio.abc
import structlog
from structlog.typing import FilteringBoundLogger

from supervisor.daemon.life.forensics import Forensics, WatchedAbort, fallback_report

__all__ = [
    "DEADLINE_ENV",
    "DEADMAN_EXIT_CODE",
    "Deadman",
    "Outcome",
    "WatchedAbort",
    "abort_deadline_s",
    "wait_for_abort",
]

T = TypeVar("T")
Outcome = Literal["returned", "wedged"]
Waiter = Callable[[threading.Event, float], bool]

DEADMAN_EXIT_CODE = 70  # EX_SOFTWARE
DEADLINE_ENV = "GPUSVD_ABORT_DEADLINE_S"
# Time allowed for writing the report after it was gathered, before the backstop exits.
_EMIT_GRACE_S = 10.0


def wait_for_abort(
    done: threading.Event,
    deadline: float,
    *,
    now: Callable[[], float] = time.monotonic,
    wait: Waiter | None = None,
) -> Outcome:
    """Wait until `done` or the absolute monotonic `deadline`; decide whether it wedged.

    `wait(done, timeout)` returns True to stop waiting early. An abort that lands in the
    last instant counts as returned: exiting then would restart a process that had just
    recovered.
    """
    waiter: Waiter = wait or threading.Event.wait
    while (remaining := deadline - now()) > 0:
        if waiter(done, remaining):
            return "returned"
    return "returned" if done.is_set() else "wedged"


def abort_deadline_s(config_value: float, env: Mapping[str, str]) -> float:
    """The abort deadline: `GPUSVD_ABORT_DEADLINE_S` overrides the config's value."""
    raw = env.get(DEADLINE_ENV)
    if raw is None:
        value, name = config_value, "deadman.abort_deadline_s"
    else:
        name = DEADLINE_ENV
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{DEADLINE_ENV} must be a number of seconds, got {raw!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return value


@dataclass(order=True)
class _Entry:
    deadline: float
    seq: int
    abort: WatchedAbort = field(compare=False)
    done: threading.Event = field(compare=False)


class Deadman:
    """Runs aborts on named threads and exits the process when one outlives its deadline."""

    def __init__(
        self,
        deadline_s: float,
        *,
        forensics: Callable[[WatchedAbort], str] | None = None,
        exit: Callable[[int], NoReturn] = os._exit,
        log: FilteringBoundLogger | None = None,
        forensics_timeout_s: float = 20.0,
    ) -> None:
        if not deadline_s > 0:
            raise ValueError(f"abort deadline must be positive, got {deadline_s!r}")
        self.deadline_s = deadline_s
        self._forensics = forensics or Forensics()
        self._exit = exit
        self._log: FilteringBoundLogger = log or structlog.get_logger("gpusvd.deadman")
        self._forensics_timeout_s = forensics_timeout_s
        self._cond = threading.Condition()
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._generation = 0
        self._thread: threading.Thread | None = None  # the current watcher; None: stopped

    # -- the callers' side -------------------------------------------------------------

    def run_abort(
        self, fn: Callable[[], T], what: str, deadline_s: float | None = None
    ) -> concurrent.futures.Future[T]:
        """Run `fn` on a new thread named `abort-{what}`, watched against the deadline.

        The future carries `fn`'s result or exception; either means it returned.
        """
        limit = self.deadline_s if deadline_s is None else deadline_s
        if not limit > 0:
            raise ValueError(f"abort deadline for {what!r} must be positive, got {limit!r}")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        done = threading.Event()
        started_mono, started_at = time.monotonic(), time.time()
        thread = threading.Thread(
            target=self._run, args=(fn, future, done), name=f"abort-{what}", daemon=True
        )
        thread.start()
        abort = WatchedAbort(
            what=what,
            thread_name=thread.name,
            started_at=started_at,
            started_mono=started_mono,
            deadline_s=limit,
            thread_ident=thread.ident,
            native_id=thread.native_id,
        )
        with self._cond:
            self._drop_returned()
            heapq.heappush(self._heap, _Entry(abort.deadline, next(self._seq), abort, done))
            self._generation += 1
            self._cond.notify_all()
        return future

    async def call(self, fn: Callable[[], T], what: str, deadline_s: float | None = None) -> T:
        """`run_abort` for the event loop: awaits the result without blocking the loop."""
        return await asyncio.wrap_future(self.run_abort(fn, what, deadline_s))

    def in_flight(self) -> list[WatchedAbort]:
        """The aborts running now, oldest deadline first."""
        with self._cond:
            return [e.abort for e in sorted(self._heap) if not e.done.is_set()]

    def _run(
        self, fn: Callable[[], T], future: concurrent.futures.Future[T], done: threading.Event
    ) -> None:
        try:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
        finally:
            done.set()
            with self._cond:
                self._cond.notify_all()

    # -- the watcher -------------------------------------------------------------------

    def start(self) -> None:
        """Start the watcher thread `deadman`."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._watch, name="deadman", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop watching; aborts still in flight are no longer held to a deadline."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._generation += 1
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The deadman as a service of a task group.

        It stops the watcher on the way out only if it started it: a deadman started
        earlier keeps watching the aborts that the group's shutdown itself makes.
        """
        started_here = self._thread is None
        self.start()
        try:
            task_status.started()
            await anyio.sleep_forever()
        finally:
            if started_here:
                self.stop()

    def _watch(self) -> None:
        while (abort := self._next_wedged()) is not None:
            self._fire(abort)

    def _next_wedged(self) -> WatchedAbort | None:
        """Block until an abort outlives its deadline (returned) or the deadman stops (None)."""
        with self._cond:
            while self._watching():
                self._drop_returned()
                if not self._heap:
                    self._cond.wait()
                    continue
                entry = self._heap[0]
                wait = functools.partial(self._wait_changed, self._generation)
                if wait_for_abort(entry.done, entry.deadline, wait=wait) == "wedged":
                    heapq.heappop(self._heap)
                    return entry.abort
            return None

    def _drop_returned(self) -> None:
        # Holding the lock. Only the front is pruned; later ones go when they reach it.
        while self._heap and self._heap[0].done.is_set():
            heapq.heappop(self._heap)

    def _wait_changed(self, generation: int, done: threading.Event, timeout: float) -> bool:
        # Holding the lock. Stops waiting on the earliest abort when it returns, and also
        # when a new abort (maybe with an earlier deadline) arrives or the deadman stops,
        # so that the caller picks the earliest deadline again.
        self._cond.wait(timeout)
        return done.is_set() or not self._watching() or self._generation != generation

    def _watching(self) -> bool:
        # A watcher that was stopped (and maybe replaced by a new start) must end.
        return self._thread is threading.current_thread()

    def _fire(self, abort: WatchedAbort) -> None:
        emitted = threading.Event()
        # Writing the report can block too (a full pipe, a stuck journal): a second
        # thread guarantees the exit whatever happens to this one.
        backstop = threading.Thread(
            target=self._backstop, args=(emitted,), name="deadman-backstop", daemon=True
        )
        backstop.start()
        report = self._gather(abort)
        self._emit(abort, report)
        emitted.set()
        self._exit(DEADMAN_EXIT_CODE)

    def _backstop(self, emitted: threading.Event) -> None:
        if not emitted.wait(self._forensics_timeout_s + _EMIT_GRACE_S):
            self._exit(DEADMAN_EXIT_CODE)

    def _gather(self, abort: WatchedAbort) -> str:
        """The full report, or what can be said without I/O if it takes too long."""
        box: list[str] = []

        def gather() -> None:
            try:
                box.append(self._forensics(abort))
            except Exception as exc:
                box.append(fallback_report(abort, f"forensics failed: {exc!r}"))

        worker = threading.Thread(target=gather, name="deadman-forensics", daemon=True)
        worker.start()
        worker.join(self._forensics_timeout_s)
        if box:
            return box[0]
        note = f"forensics did not finish within {self._forensics_timeout_s:g} s"
        return fallback_report(abort, note)

    def _emit(self, abort: WatchedAbort, report: str) -> None:
        # Raw stderr first: it needs no logging set-up and is flushed before os._exit.
        _write_all(2, (report + "\n").encode(errors="replace"))
        try:
            self._log.critical(
                "abort wedged, exiting for a restart",
                event_kind="deadman_exit",  # the journal's MESSAGE_ID for it (journal.py)
                what=abort.what,
                thread=abort.thread_name,
                deadline_s=abort.deadline_s,
                age_s=round(time.monotonic() - abort.started_mono, 1),
                exit_code=DEADMAN_EXIT_CODE,
                forensics=report,
            )
        except Exception as exc:
            _write_all(2, f"gpusvd deadman: logging the report failed: {exc!r}\n".encode())
        _flush_logs()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(OSError):
        while view:
            view = view[os.write(fd, view) :]


def _flush_logs() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
