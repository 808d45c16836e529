"""Admission: which queued jobs start now, on which cards, and why the others are held.

Pure: the scheduler gathers the facts (cards, running jobs, host memory, the queue in
order) and carries out the plan. The rules are described for operators in
docs/host-memory.md.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from supervisor.core import pinning, reservation
from supervisor.core.in_use import HostMemory as HostMemory
from supervisor.core.in_use import InUse as InUse
from supervisor.core.in_use import RunningJob as RunningJob
from supervisor.core.in_use import free_for_new_mb as free_for_new_mb
from supervisor.core.projection import Projection

HoldReason = Literal["host_ram", "vram", "gpus", "cpu", "array", "cards"]
_WAITING_FOR = {
    "array": "its array's cap",
    "host_ram": "host RAM",
    "vram": "VRAM",
    "gpus": "free GPUs",
    "cpu": "a free CPU slot",
    "cards": "its cards",
}


@dataclass(frozen=True)
class Card:
    index: int
    vram_total_mb: int
    vram_used_mb: int
    healthy: bool
    running: tuple[int, ...]  # job ids


@dataclass(frozen=True)
class Candidate:
    job_id: int
    gpus: int
    vram_mb: int | None  # per card
    projection: Projection | None
    held_since: float | None  # monotonic; None when not held
    hold_reason: HoldReason | None = None  # why it is held now
    share: bool = False  # one card, with other shared jobs while its VRAM fits
    array: int | None = None
    cap: int | None = None  # at most this many of its array run at once
    cards: tuple[int, ...] | None = None  # pinned: only these cards (None: any)
    time_limit_s: float | None = None  # its --time


@dataclass(frozen=True)
class Start:
    job_id: int
    gpus: tuple[int, ...]
    vram_reserved_mb: int  # per card
    after: tuple[int, int] | None = None  # (job, attempt) whose exit frees its place


@dataclass(frozen=True)
class Hold:
    job_id: int
    reason: HoldReason
    message: str  # the job's waiting_for


@dataclass(frozen=True)
class Plan:
    starts: tuple[Start, ...]
    holds: tuple[Hold, ...]
    reserved: tuple[int, ...] = ()  # idle cards left idle for a wide job (core/reservation)


def card_free_vram_mb(card: Card, reserved_mb: Iterable[int]) -> int:
    """VRAM on a card that nobody uses and nobody has booked."""
    return card.vram_total_mb - max(card.vram_used_mb, sum(reserved_mb))


def plan(
    candidates: Iterable[Candidate],
    *,
    cards: Sequence[Card],
    cpu_slots_free: int,
    host: HostMemory,
    running: Sequence[RunningJob] | InUse,
    now: float,
    max_backfill_wait_s: float,
) -> Plan:
    """Which candidates (in queue order, all runnable) start now and where.

    One job per card, except shared jobs: those go together on a card while the VRAM
    they declare fits what is free there (see _Pool.place_shared), and never beside a
    whole-card job. A job asking for N cards gets N at once. A job of an array whose cap
    of running jobs is reached waits, whatever is free. A job whose projection
    does not fit the free host RAM is held, unless nothing runs and nothing started
    before it. Later jobs may start past a held one (backfill) until a held job has
    waited max_backfill_wait_s; from then on it is a barrier until it runs (see
    _Barrier). The first job of several cards held for cards has cards kept for it
    (core/reservation.py). The scan stops as soon as no card and no CPU slot is left
    (nor a kept card that a job could still take); the jobs after that point get no
    entry. `running` may come summed already (InUse), as a dispatch round's plans share it.
    """
    use = running if isinstance(running, InUse) else InUse.of(running)
    pool = _Pool.build(cards, use, cpu_slots_free, host)
    starts: list[Start] = []
    holds: list[Hold] = []
    barrier: _Barrier | None = None
    arrays = defaultdict(int, use.arrays)  # this plan's starts are added (a plain copy)
    for cand in candidates:
        if pool.exhausted():
            break
        if cand.array is not None and cand.cap is not None and arrays[cand.array] >= cand.cap:
            message = f"waiting for array {cand.array}: at most {cand.cap} of its jobs run at once"
            holds.append(Hold(cand.job_id, "array", message))
            continue
        placed = pool.evaluate(cand)
        if isinstance(placed, Hold):
            words = pool.keep.hold(cand, placed.reason, placed.message)
            placed = Hold(cand.job_id, placed.reason, words)
            holds.append(placed)
            starving = _starving(cand, now, max_backfill_wait_s)
            if barrier is None and starving and pool.possible(cand):
                barrier = _Barrier(cand, placed.reason)
                pool.ram_free -= barrier.projected_mb
        elif barrier is not None and barrier.blocks(cand):
            # Its cards or slot stay idle for the barrier, and the scan ends where it would.
            pool.take(cand, placed, book_ram=False)
            holds.append(barrier.hold(cand))
        else:
            pool.take(cand, placed, book_ram=True)
            if cand.array is not None:
                arrays[cand.array] += 1
            starts.append(Start(cand.job_id, placed, (cand.vram_mb or 0) if placed else 0))
    return Plan(tuple(starts), tuple(holds), tuple(sorted(pool.keep.reserved)))


def _starving(cand: Candidate, now: float, max_wait_s: float) -> bool:
    return cand.held_since is not None and now - cand.held_since >= max_wait_s


def _projected(cand: Candidate) -> int | None:
    return cand.projection.projected_mb if cand.projection else None


@dataclass(frozen=True)
class _Barrier:
    """A job held past the backfill limit: nothing that competes with it passes it.

    Behind a job waiting for RAM, no job with a projection starts (a job with none is
    booked at nothing, so it takes none of that RAM and still may). Behind a
    job waiting for cards, CPU-only jobs may still start, and behind one waiting for a
    CPU slot, GPU jobs may: they take nothing it waits for, and its projected RAM is
    set aside first so that they cannot take that either. A job that could never start
    on this machine (more cards or VRAM than the healthy cards have) is no barrier.
    """

    job: Candidate
    reason: HoldReason

    @property
    def projected_mb(self) -> int:
        # Waiting for RAM, it blocks everything anyway; otherwise its RAM is set aside.
        return 0 if self.reason == "host_ram" else (_projected(self.job) or 0)

    def blocks(self, cand: Candidate) -> bool:
        if self.reason == "cpu":
            return cand.gpus == 0
        if self.reason in ("gpus", "vram", "cards"):
            return cand.gpus > 0
        # Waiting for RAM: only what would take RAM competes. A job with no figure is
        # booked at nothing, so it takes none of what the barrier waits for.
        return _projected(cand) is not None

    def hold(self, cand: Candidate) -> Hold:
        what = _WAITING_FOR[self.reason]
        message = f"waiting behind job {self.job.job_id}, which waits for {what}"
        return Hold(cand.job_id, self.reason, message)


def _possible(healthy_vram: dict[int, int], cand: Candidate) -> bool:
    return _could_run(cand.gpus, cand.vram_mb, healthy_vram, cand.cards)


class _Pool:
    """What is still free while one plan is made; only plan() sees it."""

    def __init__(
        self,
        idle_vram: dict[int, int],
        shared_vram: dict[int, int],
        healthy_vram: dict[int, int],
        cpu_free: int,
        ram_free: int,
        running_any: bool,
        cards: Sequence[Card] = (),
        running: Sequence[RunningJob] = (),
    ) -> None:
        self.idle_vram = idle_vram  # card index -> free VRAM, healthy cards with no job
        self.shared_vram = shared_vram  # the same for healthy cards running only shared jobs
        self.healthy_vram = healthy_vram  # total VRAM of every healthy card
        self.cpu_free = cpu_free
        self.ram_free = ram_free
        self.started_any = running_any
        # Not self.possible: a bound method would tie the pool and its keeper in a cycle,
        # one for the collector to find at every plan (a plan a claim: thousands a batch).
        self.keep = reservation.Keeper(
            cards, running, idle_vram, functools.partial(_possible, healthy_vram)
        )

    @classmethod
    def build(cls, cards: Sequence[Card], use: InUse, cpu_free: int, host: HostMemory) -> _Pool:
        reserved, shared = use.vram_mb, use.shared
        idle, company = {}, {}
        for c in cards:
            if not c.healthy:
                continue
            free = card_free_vram_mb(c, (reserved.get(j, 0) for j in c.running))
            if not c.running:
                idle[c.index] = free
            elif all(j in shared for j in c.running):
                company[c.index] = free
        healthy = {c.index: c.vram_total_mb for c in cards if c.healthy}
        ram_free = use.free_for_new_mb(host)
        return cls(
            idle, company, healthy, cpu_free, ram_free, bool(use.running), cards, use.running
        )

    def exhausted(self) -> bool:
        room = any(free > 0 for free in self.shared_vram.values())
        return not self.idle_vram and not room and self.cpu_free <= 0 and not self.keep.open()

    def possible(self, cand: Candidate) -> bool:
        return _possible(self.healthy_vram, cand)

    def evaluate(self, cand: Candidate) -> tuple[int, ...] | Hold:
        """The cards the job would get now (() for a CPU job), or why it waits. A job
        held for host RAM is asked about RAM first: while RAM would still block it, that
        stays the reason shown, whatever happens to the cards meanwhile (one wait, one
        reason). Others are asked about devices first, so that a job held for a device
        gets the same words again while none is free (jobqueue's settled jobs)."""
        if cand.hold_reason == "host_ram":
            ram = self._ram_hold(cand)
            return ram if ram is not None else self._place_devices(cand)
        placed = self._place_devices(cand)
        if isinstance(placed, Hold):
            return placed
        ram = self._ram_hold(cand)
        return ram if ram is not None else placed

    def _ram_hold(self, cand: Candidate) -> Hold | None:
        projected = _projected(cand)
        # A lone job always starts: holding it could only leave the machine idle.
        if projected is not None and projected > self.ram_free and self.started_any:
            free = max(0, self.ram_free)
            message = f"waiting for host RAM: needs {gb(projected)}, {gb(free)} free"
            return Hold(cand.job_id, "host_ram", message)
        return None

    def take(self, cand: Candidate, placed: tuple[int, ...], *, book_ram: bool) -> None:
        for index in placed:
            if cand.share:
                free = self.idle_vram.pop(index, None)
                free = self.shared_vram[index] if free is None else free
                self.shared_vram[index] = free - (cand.vram_mb or 0)
            elif not self.keep.take(index):
                del self.idle_vram[index]
        if cand.gpus <= 0:
            self.cpu_free -= 1
        self.keep.started(cand, placed)
        if book_ram:
            self.ram_free -= _projected(cand) or 0
            self.started_any = True

    def _place_devices(self, cand: Candidate) -> tuple[int, ...] | Hold:
        if cand.gpus <= 0:
            if self.cpu_free > 0:
                return ()
            return Hold(cand.job_id, "cpu", "waiting for a free CPU slot")
        if cand.share:
            return self._place_shared(cand)
        if cand.cards is not None:
            return self._place_pinned(cand)
        idle = len(self.idle_vram)
        if idle < cand.gpus:
            noun = "GPU" if cand.gpus == 1 else "GPUs"
            message = f"waiting for {cand.gpus} free {noun}, {idle} free"
            if self.shared_vram:
                message += f" ({_cards(self.shared_vram)} run shared jobs)"
            return self._backfill(cand, "gpus", message)
        need = cand.vram_mb or 0
        # Best fit: the smallest free space that suffices keeps big cards for big jobs.
        fitting = sorted((free, i) for i, free in self.idle_vram.items() if free >= need)
        if len(fitting) < cand.gpus:
            return self._backfill(cand, "vram", self._vram_message(cand, len(fitting)))
        return tuple(sorted(i for _, i in fitting[: cand.gpus]))

    def _place_pinned(self, cand: Candidate) -> tuple[int, ...] | Hold:
        """As for any whole-card job, among its own cards only, kept ones included under
        the same --time rule; held as `cards`."""
        assert cand.cards is not None  # for mypy: only pinned jobs come here
        need = cand.vram_mb or 0
        placed = pinning.place(self.idle_vram, cand.gpus, need, cand.cards, gb(need))
        return self._backfill(cand, "cards", placed) if isinstance(placed, str) else placed

    def _backfill(
        self, cand: Candidate, reason: reservation.Reason, message: str
    ) -> tuple[int, ...] | Hold:
        got = self.keep.backfill(cand, reason, message)  # onto cards kept for a wide job?
        return Hold(cand.job_id, *got) if isinstance(got, reservation.Wait) else got

    def _place_shared(self, cand: Candidate) -> tuple[int, ...] | Hold:
        """One card with room for the job's VRAM: best fit among the cards already shared,
        and an idle card only when none of those has room, so that whole cards stay free
        for whole-card jobs. A shared job is held for VRAM, never for free GPUs: a card
        that is not idle may still take it."""
        need = cand.vram_mb or 0
        pools = [pinning.allowed(p, cand.cards) for p in (self.shared_vram, self.idle_vram)]
        for pool in pools:
            fitting = sorted((free, i) for i, free in pool.items() if free >= need)
            if fitting:
                return (fitting[0][1],)
        most = max([*pools[0].values(), *pools[1].values(), 0])
        where = "any card" if cand.cards is None else f"its {pinning.card_text(cand.cards)}"
        message = f"waiting for VRAM: needs {gb(need)}, at most {gb(max(0, most))} free on {where}"
        return Hold(cand.job_id, "vram", message)

    def _vram_message(self, cand: Candidate, fitting: int) -> str:
        need = gb(cand.vram_mb or 0)
        if cand.gpus == 1:
            most = max(self.idle_vram.values())
            return f"waiting for VRAM: needs {need} on one card, {gb(max(0, most))} free at most"
        return f"waiting for VRAM: needs {need} on each of {cand.gpus} cards, {fitting} have it"


def _cards(free: Mapping[int, int]) -> str:
    indices = sorted(free)
    noun = "card" if len(indices) == 1 else "cards"
    return f"{noun} {', '.join(map(str, indices))}"


def could_run(
    gpus: int, vram_mb: int | None, cards: Sequence[Card], pinned: tuple[int, ...] | None = None
) -> bool:
    """Whether a job could start on this machine (on its own cards, when `pinned`) once
    everything else has left."""
    return _could_run(gpus, vram_mb, {c.index: c.vram_total_mb for c in cards if c.healthy}, pinned)


def _could_run(
    gpus: int, vram_mb: int | None, healthy_vram: Mapping[int, int], pinned: tuple[int, ...] | None
) -> bool:
    need = vram_mb or 0
    usable = pinning.allowed(healthy_vram, pinned).values()
    return sum(1 for total in usable if total >= need) >= gpus


def gb(mb: int) -> str:
    """A size for people: "~93 GiB", or "~1.5 GiB" below 10 GiB."""
    size = mb / 1024
    if size >= 10:
        return f"~{round(size)} GiB"
    return f"~{size:.1f}".removesuffix(".0") + " GiB"
