"""A small event broker: the engine publishes what it decided, services subscribe.

Subscribers are plain functions called in publication order; they must not block (a
service that has work to do puts the event on its own stream and does it in its own
task group)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

T = TypeVar("T")


class Broker:
    def __init__(self) -> None:
        self._subscribers: dict[type[Any], list[Callable[[Any], None]]] = {}

    def subscribe(self, kind: type[T], handler: Callable[[T], None]) -> None:
        self._subscribers.setdefault(kind, []).append(handler)

    def publish(self, event: object) -> None:
        for handler in self._subscribers.get(type(event), ()):
            handler(event)

    def stream(self, *kinds: type[Any]) -> MemoryObjectReceiveStream[Any]:
        """A stream of the events of these kinds, from now on, for a service's own loop."""
        send: MemoryObjectSendStream[Any]
        send, receive = anyio.create_memory_object_stream[Any](float("inf"))
        for kind in kinds:
            self.subscribe(kind, send.send_nowait)
        return receive
