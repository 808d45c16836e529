"""Spawns parked until the attempt they follow has ended (`after`): in memory only, in
arrival order, which is their start order. A parked spawn that is dropped, or refused at
its turn, drops those parked behind it: what they followed will never run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from . import spawn
from .jobs import Reply
from .journal import Key

DROPPED = {"code": "dropped", "message": "dropped before it started"}


class Conn(Protocol):
    closed: bool


@dataclass
class Parked:
    """A spawn, validated, that starts once the attempt `after` has ended."""

    spec: spawn.Spec
    after: Key
    conn: Conn  # it goes with this connection
    reply: Reply


class Parking:
    def __init__(self) -> None:
        self.spawns: dict[Key, Parked] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self.spawns

    def __len__(self) -> int:
        return len(self.spawns)

    def park(self, parked: Parked) -> None:
        self.spawns[(parked.spec.job, parked.spec.attempt)] = parked

    def released_by(self, ended: Key) -> list[Parked]:
        """The spawns that waited for `ended`, taken out to start now."""
        out = [p for p in self.spawns.values() if p.after == ended]
        for p in out:
            del self.spawns[(p.spec.job, p.spec.attempt)]
        return out

    def drop(self, key: Key) -> bool:
        """Drop a parked spawn (answered `dropped`), and those parked behind it; whether
        it was parked."""
        parked = self.spawns.pop(key, None)
        if parked is None:
            return False
        parked.reply({"error": dict(DROPPED)})
        self.drop_behind(key)
        return True

    def drop_behind(self, key: Key) -> None:
        for behind in [k for k, p in self.spawns.items() if p.after == key]:
            self.drop(behind)

    def drop_conn(self, conn: Conn) -> list[Key]:
        """Those its connection sent, unanswered: nobody is left to be told."""
        keys = [key for key, p in self.spawns.items() if p.conn is conn]
        for key in keys:
            del self.spawns[key]
        return keys
