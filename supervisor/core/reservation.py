"""Reservations for wide jobs: EASY backfill, as Slurm does it.

The first job of several cards that a pass holds for cards gets the idle cards that fit
it, and each one that frees after, until it has enough. A later job may take a reserved
card only when its `--time` ends before the wide job is due to start; a job without a
time limit never does. The start is estimated from the running jobs' time limits (start
plus `--time`): the time at which enough cards that fit the wide job will have been let
go. When those cards can only come from a job without a limit, there is no estimate, and
no job takes a reserved card. A job pinned to cards (`--cards`, core/pinning.py) counts
only its own cards in all of this: a pinned wide job keeps, and waits for, only cards
it may use, and a pinned job backfills only onto kept cards among its own. Pure:
admission asks, and builds the holds it returns. The rules are described for operators
in docs/host-memory.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, NamedTuple, Protocol, TypeVar

from supervisor.core import pinning
from supervisor.core.jobs import Job
from supervisor.core.records import epoch_of
from supervisor.core.table import Live, waiting_ahead

Reason = Literal["gpus", "vram", "cards"]  # the holds of a job waiting for cards

# What is read of admission's Candidate, Card and RunningJob (admission imports this
# module, so it names their fields rather than import them).


class Candidate(Protocol):
    @property
    def job_id(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def vram_mb(self) -> int | None: ...
    @property
    def share(self) -> bool: ...
    @property
    def time_limit_s(self) -> float | None: ...
    @property
    def cards(self) -> tuple[int, ...] | None: ...  # pinned: only these (None: any)


C = TypeVar("C", bound=Candidate)


class Card(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def vram_total_mb(self) -> int: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def running(self) -> tuple[int, ...]: ...


class RunningJob(Protocol):
    @property
    def job_id(self) -> int: ...
    @property
    def ends_in_s(self) -> float | None: ...


@dataclass(frozen=True)
class Reservation:
    job_id: int  # the wide job
    cards: tuple[int, ...]  # the idle cards kept for it
    start_in_s: float | None  # when enough cards are due (seconds from now); None: unknown
    due_to: int | None  # the running job whose end gives the estimate (or has no limit)

    def admits(self, time_limit_s: float | None) -> bool:
        """Whether a job with this `--time` ends before the wide job is due to start."""
        if time_limit_s is None or self.start_in_s is None:
            return False
        return time_limit_s <= self.start_in_s

    def may_backfill(self) -> bool:
        """Whether any job at all could take a reserved card."""
        return self.start_in_s is not None and self.start_in_s > 0

    def waiting(self, message: str) -> str:
        """The wide job's `waiting_for`: what it waits for and what is kept for it."""
        kept = f"{_cards(self.cards)} reserved for it" if self.cards else "cards reserved for it"
        if not self.cards:
            kept += " as they free"
        return f"{message}; {kept}, {self._due()}"

    def kept(self, cards: Sequence[int]) -> str:
        """What a job that the reserved `cards` (those kept that it may use) would not fit
        is told besides."""
        return f"{_cards(cards)} reserved for job {self.job_id}"

    def blocked(self, time_limit_s: float | None, cards: Sequence[int]) -> str:
        """The `waiting_for` of a job that the reserved `cards` (those kept that it may
        use) would fit, but may not take."""
        head = f"waiting for {_cards(cards)}, reserved for job {self.job_id}"
        if self.start_in_s is None:
            return f"{head}, which has no start estimate ({self._unknown()})"
        if time_limit_s is None:
            return f"{head} (only a job whose --time ends before its start may use them)"
        return f"{head} (its start is due by job {self.due_to}'s time limit; --time ends after)"

    def _due(self) -> str:
        if self.start_in_s is None:
            return f"no start estimate ({self._unknown()})"
        what = "the rest" if self.cards else "enough"
        return f"{what} due by job {self.due_to}'s time limit"

    def _unknown(self) -> str:
        if self.due_to is None:
            return "no running job frees a card that fits it"
        return f"job {self.due_to} has no time limit"


def reserve(
    cand: Candidate,
    idle_vram: Mapping[int, int],
    cards: Sequence[Card],
    running: Sequence[RunningJob],
    starting: Mapping[int, tuple[float | None, int]],
) -> Reservation:
    """The reservation of a wide job held for cards: the idle cards that fit it, and the
    time at which the running jobs' limits let go of enough more. A card's jobs all end
    by the latest of their limits; an idle card without room for its VRAM is not counted
    (what fills it is not gpusv's), nor are cards that could never hold it. `starting`:
    the cards that jobs started in this pass took, with their --time and id. A pinned
    job keeps, and counts as freeing, only the cards it may use."""
    need = cand.vram_mb or 0
    usable = pinning.allowed(idle_vram, cand.cards)
    mine = tuple(sorted(i for i, free in usable.items() if free >= need)[: cand.gpus])
    left = {j.job_id: j.ends_in_s for j in running}
    freeing: list[tuple[float, int]] = []  # (seconds until the card frees, its last job)
    for card in cards:
        if not card.healthy or card.vram_total_mb < need:
            continue
        if cand.cards is not None and card.index not in cand.cards:
            continue
        if card.index in starting:
            limit, job = starting[card.index]
            ends = [(limit, job)] + [(left.get(j), j) for j in card.running]
            freeing.append(_card_frees(ends))
        elif card.running:
            freeing.append(_card_frees([(left.get(j), j) for j in card.running]))
    freeing.sort()
    short = cand.gpus - len(mine)
    if short <= 0 or short > len(freeing):
        return Reservation(cand.job_id, mine, None, None)
    at, due_to = freeing[short - 1]
    start = None if at == float("inf") else max(0.0, at)
    return Reservation(cand.job_id, mine, start, due_to)


def _card_frees(jobs: Sequence[tuple[float | None, int]]) -> tuple[float, int]:
    """When a card's last job is due to end, and which job that is (inf: one has no limit)."""
    return max((float("inf") if due is None else due, job) for due, job in jobs)


def wants(cand: Candidate, reason: str) -> bool:
    """Whether a job held for `reason` is one that has cards kept for it: a job of several
    whole cards waiting for cards (a pinned one, for its own). A job held for host RAM
    keeps that hold alone."""
    return reason in ("gpus", "vram", "cards") and cand.gpus > 1 and not cand.share


class Wait(NamedTuple):
    reason: Reason
    message: str


def backfill(
    res: Reservation | None,
    reserved: Mapping[int, int],
    idle_vram: Mapping[int, int],
    cand: Candidate,
    reason: Reason,
    message: str,
) -> tuple[int, ...] | Wait:
    """For a whole-card job that the free cards cannot take (held for `reason`, `message`
    says why): the cards it gets when its --time ends before the wide job is due; else why
    it waits: for the reserved cards when they would fit it, else its own hold, naming
    what is kept. Reserved cards go first (it ends before they are wanted), so that the
    free ones stay for jobs without a time limit; best fit within each. A pinned job sees
    only its own cards of both: a kept card outside them is neither taken nor named, and
    it waits as `cards` whatever it waits for."""
    reserved = pinning.allowed(reserved, cand.cards)
    idle_vram = pinning.allowed(idle_vram, cand.cards)
    if res is None or not reserved:
        return Wait(reason, message)
    need = cand.vram_mb or 0
    fitting = sorted(
        (i not in reserved, free, i)
        for pool in (reserved, idle_vram)
        for i, free in pool.items()
        if free >= need
    )
    if len(fitting) < cand.gpus:
        return Wait(reason, f"{message}; {res.kept(tuple(reserved))}")
    if res.admits(cand.time_limit_s):
        return tuple(sorted(i for _, _, i in fitting[: cand.gpus]))
    words = res.blocked(cand.time_limit_s, tuple(reserved))
    return Wait("gpus" if cand.cards is None else "cards", words)


class Keeper(Generic[C]):
    """What one admission pass keeps for the first wide job it holds for cards: admission's
    pool has one, and asks it as it holds, places and starts jobs."""

    def __init__(
        self,
        cards: Sequence[Card],
        running: Sequence[RunningJob],
        idle_vram: dict[int, int],
        possible: Callable[[C], bool],
    ) -> None:
        self.cards, self.running = cards, running
        self.idle_vram = idle_vram  # the pool's free cards, which kept ones leave
        self.possible = possible  # whether a job could ever start here
        self.reservation: Reservation | None = None
        self.reserved: dict[int, int] = {}  # kept idle cards (out of the free pool) -> VRAM
        self.starting: dict[int, tuple[float | None, int]] = {}  # card -> (--time, job)

    def hold(self, cand: C, reason: str, message: str) -> str:
        """The words of a held job. The first wide job held for cards that could ever start
        here has the free cards that fit it taken out of the pool and kept for it."""
        if self.reservation is not None or not wants(cand, reason) or not self.possible(cand):
            return message
        res = reserve(cand, self.idle_vram, self.cards, self.running, self.starting)
        self.reservation, self.reserved = res, {i: self.idle_vram.pop(i) for i in res.cards}
        return res.waiting(message)

    def backfill(self, cand: Candidate, reason: Reason, message: str) -> tuple[int, ...] | Wait:
        return backfill(self.reservation, self.reserved, self.idle_vram, cand, reason, message)

    def take(self, index: int) -> bool:
        """Whether the card was a kept one (taken by a job that ends before it is wanted)."""
        return self.reserved.pop(index, None) is not None

    def started(self, cand: Candidate, placed: tuple[int, ...]) -> None:
        """A job took these cards in this pass: they free by its --time, if it has one."""
        self.starting.update(dict.fromkeys(placed, (cand.time_limit_s, cand.job_id)))

    def open(self) -> bool:
        """Whether a later job could still take a kept card."""
        res = self.reservation
        return bool(self.reserved) and res is not None and res.may_backfill()


def time_left_s(
    job_id: int, lives: Mapping[int, Live], jobs: Mapping[int, Job], now: float
) -> float | None:
    """Seconds until a running job's `--time` ends it (never below 0; None: no limit or
    not known). A job claimed to follow another starts when that one ends."""
    live, job = lives.get(job_id), jobs.get(job_id)
    limit = job.spec.time_limit_s if job is not None else None
    if live is None or limit is None:
        return None
    if live.after is not None and waiting_ahead(live, lives):
        before = time_left_s(live.after[0], lives, jobs, now)
        return None if before is None else before + limit
    return max(0.0, epoch_of(live.attempt.started_at) + limit - now)


def _cards(indices: Sequence[int]) -> str:
    noun = "card" if len(indices) == 1 else "cards"
    return f"{noun} {','.join(map(str, sorted(indices)))}"
