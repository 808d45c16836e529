"""Who holds the daemon's connections, and who gives one up when a newcomer needs room.

An idle connection (waiting for its next request) is cheap to hold but must not lock
anyone out. So a caps are met by eviction, not refusal: a user at its own cap gives up
its longest-idle connection to its own newcomer, and at the daemon's cap the user who
holds the most connections gives up its longest-idle one. A newcomer is refused only
when every connection that could make room is busy answering a request (or is kept: a
`run` client's connection, whose close would cancel its job). Only idle connections that
have waited at least EVICT_IDLE_S are taken, so a client between two requests keeps its
connection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

EVICT_IDLE_S = 1.0


@dataclass
class Held:
    serial: int
    uid: int
    scope: anyio.CancelScope
    idle_since: float | None = None  # monotonic; None while a request is answered


def victim(held: Iterable[Held], now: float, kept: Callable[[int], bool]) -> Held | None:
    """The longest-idle of these connections that may be closed, or None."""
    idle = [
        h
        for h in held
        if h.idle_since is not None and now - h.idle_since >= EVICT_IDLE_S and not kept(h.serial)
    ]
    return min(idle, key=lambda h: (h.idle_since, h.serial), default=None)


class Connections:
    def __init__(self, max_total: int, max_per_user: int, kept: Callable[[int], bool]) -> None:
        self.max_total, self.max_per_user = max_total, max_per_user
        self.kept = kept
        self.held: dict[int, Held] = {}
        self.by_uid: Counter[int] = Counter()

    def room_for(self, uid: int, now: float) -> str | None:
        """Make room for a new connection of `uid` by closing idle ones; None when there
        is room, else why it is refused."""
        if self.by_uid[uid] >= self.max_per_user:
            mine = victim((h for h in self.held.values() if h.uid == uid), now, self.kept)
            if mine is None:
                return (
                    f"uid {uid} holds its limit of {self.max_per_user} connections to gpusvd, "
                    "none of them idle; retry"
                )
            self.evict(mine)
        if len(self.held) >= self.max_total:
            for holder, _count in self.by_uid.most_common():
                theirs = victim((h for h in self.held.values() if h.uid == holder), now, self.kept)
                if theirs is not None:
                    self.evict(theirs)
                    return None
            return f"gpusvd is serving its limit of {self.max_total} connections, none idle; retry"
        return None

    def add(self, held: Held) -> None:
        self.held[held.serial] = held
        self.by_uid[held.uid] += 1

    def evict(self, held: Held) -> None:
        held.scope.cancel()
        self.release(held.serial)

    def release(self, serial: int) -> None:
        """The connection no longer counts (closed, or evicted); twice is once."""
        held = self.held.pop(serial, None)
        if held is not None:
            self.by_uid[held.uid] -= 1
            if not self.by_uid[held.uid]:
                del self.by_uid[held.uid]
