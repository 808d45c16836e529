"""A small event broker: the engine publishes what it decided, services subscribe.

Subscribers are plain functions called in publication order; they must not block (a
service that has work to do puts the event on its own stream and does it in its own
task group).

Each subscriber is isolated from the others and from the publisher: one that raises is
logged, with the event's type and its own name, and counted (`failures`, the metric
gpusv_listener_errors_total), and the next one is called. The engine publishes after its
commit, so a faulty listener can neither stop the daemon nor undo what was committed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

log = structlog.get_logger("gpusvd.broker")
T = TypeVar("T")


def listener_name(handler: Callable[..., Any]) -> str:
    """`Dispatcher._changed`, `MemoryObjectSendStream.send_nowait`, `on_change`, ..."""
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    module = getattr(handler, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def job_of(event: object) -> int | None:
    """The job an event is about, where it names one (journald's GPUSV_JOB then)."""
    job = getattr(event, "job", None) or getattr(event, "new", None)
    found = getattr(event, "job_id", None) or getattr(job, "id", None)
    return found if isinstance(found, int) else None


class Broker:
    def __init__(self) -> None:
        self._subscribers: dict[type[Any], list[Callable[[Any], None]]] = {}
        self.failures: Counter[str] = Counter()  # listeners that raised, by event type

    def subscribe(self, kind: type[T], handler: Callable[[T], None]) -> None:
        self._subscribers.setdefault(kind, []).append(handler)

    def publish(self, event: object) -> None:
        for handler in self._subscribers.get(type(event), ()):
            try:
                handler(event)
            except Exception:
                kind = type(event).__name__
                self.failures[kind] += 1
                name = listener_name(handler)
                about = {"job_id": job} if (job := job_of(event)) is not None else {}
                log.exception("listener failed", event_type=kind, listener=name, **about)

    def stream(self, *kinds: type[Any]) -> MemoryObjectReceiveStream[Any]:
        """A stream of the events of these kinds, from now on, for a service's own loop."""
        send: MemoryObjectSendStream[Any]
        send, receive = anyio.create_memory_object_stream[Any](float("inf"))
        for kind in kinds:
            self.subscribe(kind, send.send_nowait)
        return receive
