"""The jobs waiting to run, in queue order, indexed so that a dispatch pass costs the same
with a hundred jobs queued as with a hundred thousand.

A job held only because none of its kind of device (a card, a CPU slot) was free, or
because its array already runs as many jobs as its cap allows (kind `array:ID`), is
*settled*: evaluated again while none is free, it would be held again with the same
words, so a pass leaves it out. A pass reads the live jobs, and of a kind's settled jobs
only the first few when units of that kind are free (Dispatcher._plan checks that they
were enough). Pure bookkeeping over plain data: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from supervisor.core.jobs import Job

Key = tuple[int, int]  # (-priority, id): the queue's order
KINDS = ("gpu", "cpu")
DEVICE_HOLD = {"gpu": "gpus", "cpu": "cpu"}  # the hold of a job whose kind has none free
INF = float("inf")


def kind_of(job: Job) -> str:
    return "gpu" if job.spec.gpus > 0 else "cpu"


def array_kind(array_id: int) -> str:
    return f"array:{array_id}"


def in_kind(job: Job, kind: str) -> bool:
    if kind.startswith("array:"):
        return job.spec.array_id is not None and kind == array_kind(job.spec.array_id)
    return kind_of(job) == kind


def key_of(job: Job) -> Key:
    return (-job.spec.priority, job.id)


def used_before(
    started: Iterable[tuple[Job, tuple[int, ...]]],
    kind: str,
    cut: Key,
    idle: Collection[int] | None = None,
) -> int:
    """Units of `kind` that starts (a job and its cards) took before `cut` in queue order.
    Given the cards that were `idle`, a card counts once, and only if it was idle: shared
    jobs may start several to a card, or on a card that was already in use."""
    used = 0
    taken: set[int] = set()
    for job, cards in started:
        if not in_kind(job, kind) or key_of(job) >= cut:
            continue
        if kind != "gpu":
            used += 1
        elif idle is None:
            used += len(cards)
        else:
            taken.update(c for c in cards if c in idle)
    return used + len(taken)


def refit(*tables: dict[Any, Any] | set[Any]) -> None:
    """Each dict or set made again in place at the size of what it holds: one keeps the
    room of the most it ever held (a 100,000-job batch: megabytes each) until then."""
    for table in tables:
        kept = table.copy()
        table.clear()
        table.update(kept)  # type: ignore[arg-type]  # a dict from a dict, a set from a set


def _remove(keys: list[Key], key: Key) -> None:
    i = bisect.bisect_left(keys, key)
    if i < len(keys) and keys[i] == key:
        del keys[i]


class JobQueue:
    def __init__(self) -> None:
        self.live: list[Key] = []  # sorted
        self.settled: dict[str, list[Key]] = {kind: [] for kind in KINDS}  # each sorted
        self.settled_kind: dict[int, str] = {}
        self.oldest = dict.fromkeys(KINDS, INF)  # held_since of the oldest settled, or less
        self.backoff: list[tuple[float, int]] = []  # heap of (not_before, id)
        self.hold_of: dict[int, str] = {}  # hold reasons, counted in `held`
        self.held: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.live) + sum(len(keys) for keys in self.settled.values())

    def refit(self) -> None:
        """Its tables sized to what they hold now (table.refit)."""
        refit(self.settled_kind, self.hold_of, self.held)

    def add(self, job: Job) -> None:
        bisect.insort(self.live, key_of(job))
        if job.not_before:
            heapq.heappush(self.backoff, (job.not_before, job.id))
        self.set_hold(job.id, job.hold_reason)

    def remove(self, job: Job) -> None:
        """Take the job out (it started or ended); doing it twice is harmless."""
        kind = self.settled_kind.pop(job.id, None)
        _remove(self.live if kind is None else self.settled[kind], key_of(job))
        self._forget(kind)
        self.set_hold(job.id, None)

    def _forget(self, kind: str | None) -> None:
        """An array's list goes once empty: passes look at every list they hold."""
        if kind is not None and kind not in KINDS and not self.settled[kind]:
            del self.settled[kind]

    def set_hold(self, job_id: int, reason: str | None) -> None:
        old = self.hold_of.pop(job_id, None)
        if old:
            self.held[old] -= 1
        if reason:
            self.hold_of[job_id] = reason
            self.held[reason] += 1

    def held_counts(self) -> dict[str, int]:
        return {reason: n for reason, n in self.held.items() if n > 0}

    # ---- settled jobs -----------------------------------------------------------------

    def settle(self, jobs: Iterable[Job], held_since: Mapping[int, float]) -> None:
        new = {job.id: job for job in jobs if job.id not in self.settled_kind}
        if not new:
            return
        self.live = [key for key in self.live if key[1] not in new]
        for kind in KINDS:
            mine = [job for job in new.values() if kind_of(job) == kind]
            if mine:
                self.settled[kind] = list(
                    heapq.merge(self.settled[kind], sorted(map(key_of, mine)))
                )
                since = min(held_since.get(job.id, INF) for job in mine)
                self.oldest[kind] = min(self.oldest[kind], since)
        for job in new.values():
            self.settled_kind[job.id] = kind_of(job)

    def settle_array(self, jobs: Iterable[Job]) -> None:
        """Jobs held by their array's cap: read again only while their array has room."""
        by_kind: dict[str, list[Key]] = {}
        for job in jobs:
            if job.id not in self.settled_kind and job.spec.array_id is not None:
                kind = array_kind(job.spec.array_id)
                by_kind.setdefault(kind, []).append(key_of(job))
                self.settled_kind[job.id] = kind
        if not by_kind:
            return
        new = {key for keys in by_kind.values() for key in keys}
        self.live = [key for key in self.live if key not in new]
        for kind, keys in by_kind.items():
            self.settled[kind] = list(heapq.merge(self.settled.get(kind, []), sorted(keys)))

    def unsettle(self, job: Job) -> None:
        """Its wait changed: it is live again."""
        kind = self.settled_kind.pop(job.id, None)
        if kind is not None:
            _remove(self.settled[kind], key_of(job))
            self._forget(kind)
            bisect.insort(self.live, key_of(job))

    def keys(self, ends: Mapping[str, int], extra: Iterable[list[Key]] = ()) -> Iterator[Key]:
        """In queue order: the live jobs, each kind's first `ends[kind]` settled ones, and
        `extra` (sorted lists of settled keys past those)."""
        firsts = (self.settled[kind][:end] for kind, end in ends.items())
        sources = [keys for keys in (self.live, *firsts, *extra) if keys]
        if len(sources) == 1:  # a batch's jobs are one kind: no merge to pay for
            return iter(sources[0])
        return heapq.merge(*sources)

    def ends(self, free: Mapping[str, int], w: int) -> dict[str, int]:
        """How many settled jobs of each kind a pass reads: none of a kind with no unit
        free, else as many as the free units plus `w`."""
        return {
            k: min(len(v), free.get(k, 0) + w if free.get(k, 0) > 0 else 0)
            for k, v in self.settled.items()
        }

    def cuts(self, ends: Mapping[str, int]) -> dict[str, Key]:
        """Per kind, the first settled job that `keys(ends)` leaves out, if any."""
        return {k: self.settled[k][end] for k, end in ends.items() if end < len(self.settled[k])}

    def starving(
        self,
        kind: str,
        start: int,
        now: float,
        limit: float,
        held_since: Mapping[int, float],
        possible: Callable[[int], bool],
    ) -> list[Key]:
        """Settled jobs of `kind` from `start` on, held `limit` seconds or more, in queue
        order up to the first one that `possible` accepts: those a pass must still read,
        since the first may become admission.plan's barrier."""
        keys = self.settled[kind]
        if now - self.oldest.get(kind, now) < limit:  # an array's cap is never a barrier
            return []  # none has waited that long
        out, oldest = [], now
        for i in range(start, len(keys)):
            since = held_since.get(keys[i][1], now)
            oldest = min(oldest, since)
            if now - since >= limit:
                out.append(keys[i])
                if possible(keys[i][1]):
                    return out
        if start == 0:
            self.oldest[kind] = oldest  # all seen: no longer an estimate
        return out

    # ---- retry backoff ----------------------------------------------------------------

    def next_backoff(self, now_wall: float, current: Callable[[int, float], bool]) -> float | None:
        """Seconds until the earliest backoff ends; `current(id, not_before)` says whether
        an entry still describes a queued job."""
        while self.backoff:
            at, job_id = self.backoff[0]
            if at > now_wall and current(job_id, at):
                return at - now_wall
            heapq.heappop(self.backoff)
        return None
