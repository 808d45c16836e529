"""A first reading of every card, each on its own thread and deadline.

One wedged card must not hold up the others at start: a probe that has not answered by
the deadline leaves its card `lost`, and the card stays so (without piling up threads)
until that probe returns. The next reading then judges it afresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from supervisor.gpus.base import GpuLost

T = TypeVar("T")
DEFAULT_DEADLINE_S = 10.0


class Pending:
    """A probe that has not returned by its deadline."""

    def __init__(self, index: int, deadline_s: float) -> None:
        self.index = index
        self.deadline_s = deadline_s


class _Call(Generic[T]):
    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.result: T | BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # handed to the caller, who decides
            self.result = e


class Prober:
    """Runs per-card calls under one shared deadline and remembers the ones still blocked."""

    def __init__(self, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._blocked: dict[int, threading.Thread] = {}

    def each(self, count: int, fn: Callable[[int], T]) -> list[T | BaseException | Pending]:
        """fn(i) for every card at once; what each returned, raised, or Pending."""
        calls: list[_Call[T] | None] = []
        for i in range(count):
            if self._still_blocked(i):
                calls.append(None)  # one thread per wedged card, never a pile of them
                continue
            started: _Call[T] = _Call(_bind(fn, i))
            started.thread.name = f"gpu-probe-{i}"
            started.thread.start()
            calls.append(started)
        end = time.monotonic() + self.deadline_s
        out: list[T | BaseException | Pending] = []
        for i, call in enumerate(calls):
            if call is None:
                out.append(Pending(i, self.deadline_s))
                continue
            call.thread.join(max(0.0, end - time.monotonic()))
            if call.thread.is_alive():
                with self._lock:
                    self._blocked[i] = call.thread
                out.append(Pending(i, self.deadline_s))
            elif call.result is None:
                out.append(RuntimeError(f"probe of card {i} returned nothing"))
            else:
                out.append(call.result)
        return out

    def check(self, index: int, what: str) -> None:
        """GpuLost while the card's start-up probe is still blocked in the driver."""
        if not self._still_blocked(index):
            return
        raise GpuLost(
            f"{what} did not answer its start-up probe within {self.deadline_s:g} s "
            "(read again once the driver returns)"
        )

    def _still_blocked(self, index: int) -> bool:
        with self._lock:
            thread = self._blocked.get(index)
            if thread is not None and not thread.is_alive():
                del self._blocked[index]
                thread = None
        return thread is not None


def _bind(fn: Callable[[int], T], i: int) -> Callable[[], T]:
    return lambda: fn(i)
