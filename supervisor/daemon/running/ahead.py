"""Spawns started ahead that their keepers hold back, until the spawn call returns: what
the runner drops before a hung job is killed, and waits on before a drain stops the jobs
in front; and every spawn, until it is on its keeper's connection: what a spawn claimed
behind it waits for."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from supervisor.daemon.running.keepers import Drop

DROP_WAIT_S = 5.0  # for a held-back spawn's `dropped` answer, before a hung job is killed


@dataclass
class Ahead:
    """A spawn started ahead, held back by its keeper until `after` exits."""

    after: tuple[int, int]
    drop: Drop = field(default_factory=Drop)  # asked: its keeper drops it
    answered: anyio.Event = field(default_factory=anyio.Event)  # its spawn call returned


@dataclass
class Sending:
    """A spawn, from its order until its request is on its keeper's connection (`sent`),
    or known never to be (`over`, not `sent`). A keeper starts a spawn whose `after` it
    has never heard of at once: so a spawn claimed behind this one is sent only once this
    one was, and not at all if this one never is."""

    front: Sending | None = None  # the spawn ahead in its line, if not yet sent when ordered
    sent: bool = False
    over: anyio.Event = field(default_factory=anyio.Event)

    def written(self) -> None:
        self.sent = True
        self.over.set()

    async def front_sent(self) -> bool:
        """Whether the spawn in front, if one was still to be sent, reached its keeper."""
        front, self.front = self.front, None
        if front is None:
            return True
        await front.over.wait()
        return front.sent


def behind(aheads: dict[int, Ahead], job_id: int) -> list[Ahead]:
    """The line held back behind `job_id`: what follows it, and what follows those.
    `aheads` is in launch order, so a job's front comes before it."""
    out, fronts = [], {job_id}
    for key, a in aheads.items():
        if a.after[0] in fronts:
            out.append(a)
            fronts.add(key)
    return out


async def answers(spawns: list[Ahead]) -> None:
    """Until each spawn call has returned (bounded: DROP_WAIT_S)."""
    with anyio.move_on_after(DROP_WAIT_S):
        for a in spawns:
            await a.answered.wait()
