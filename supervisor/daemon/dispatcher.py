"""The dispatch loop: admission passes over the engine's table, whose plans it hands to
the engine as one Dispatch command per pass.

SQLite rows are the truth; the engine's table keeps only the active jobs (queued and
running), indexed so that a pass never scans the whole queue when nothing can start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import anyio
import anyio.abc

from supervisor.core import admission
from supervisor.core.commands import AttemptEnded, Changed, Dispatch, ProcessStarted, Stop
from supervisor.core.evolve import evolve
from supervisor.core.in_use import running_jobs
from supervisor.core.jobqueue import Key, array_kind, used_before
from supervisor.core.jobs import FailureReason, JobSpec, JobState
from supervisor.core.projection import Projection
from supervisor.core.table import Line, claimed_ahead, waiting_ahead
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import Config
from supervisor.daemon.engine import Engine
from supervisor.daemon.lines import followable, last_run, refill_pause
from supervisor.daemon.run_times import RunTimes
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.waits import Waits

STORAGE_RECHECK_S = 1.0  # while the database cannot be written, look again this often


class Reading(NamedTuple):
    """What a round's plans share: the host's memory, and what the table's running and
    claimed jobs take as admission sees it (the round's own claims are added to it)."""

    host: admission.HostMemory
    use: admission.InUse


class CardsChanged:
    """A card's health or use changed: a pass may place differently."""


class Dispatcher:
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        book: MemoryBook,
        broker: Broker,
        *,
        cards: Callable[[], list[admission.Card]],
        rss_mb: Callable[[int], int],
        mem_total_mb: int,
        available_mb: Callable[[], int],
        uuids_of: Callable[[tuple[int, ...]], tuple[str, ...]] = lambda _cards: (),
        beat: Callable[[], None] = lambda: None,
        can_follow: Callable[[tuple[int, ...]], bool] = lambda _cards: False,
        can_chain: Callable[[tuple[int, ...]], bool] = lambda _cards: False,
        drop_ahead: Callable[[list[int]], None] = lambda _job_ids: None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.table = engine.table
        self.book = book
        # What the loop reads of other parts: the cards, a job's RSS, the cards' UUIDs.
        self.cards, self.rss_mb, self.uuids_of = cards, rss_mb, uuids_of
        self.beat = beat
        self.can_follow = can_follow  # whether the keeper of these cards starts jobs ahead
        self.can_chain = can_chain  # ... and behind one that waits itself
        self.drop_ahead = drop_ahead  # asks the keepers to drop these jobs' parked spawns
        self.wake = anyio.Event()
        self.stale = False  # the table changed since this pass planned (see _may_claim)
        self._claimed: dict[int, admission.RunningJob] = {}  # this round's claims ahead
        self._round: Reading | None = None  # this round's reading (_read_once)
        self.waits = Waits(engine)  # queue_wait events left for a later pass (waits.py)
        self.draining = False
        self.paused = (cfg.state_dir / "paused").exists()  # `gpusv pause` outlives restarts
        self.available_mb = available_mb  # MemAvailable, read at each pass
        total = self.mem_total_mb = mem_total_mb
        self.limit_mb = cfg.host_memory.limit_mb(total)
        self.reserve_mb = cfg.host_memory.reserve.resolve(total)
        broker.subscribe(Changed, self._changed)
        broker.subscribe(CardsChanged, lambda _ev: self.poke())
        self.last_run_s = RunTimes()  # kind -> its last success, s
        if cfg.jobs.start_ahead_s > 0:
            broker.subscribe(AttemptEnded, self.last_run_s.ran)
            # A start may be followed: a pass soon, but nothing the plan must see anew.
            broker.subscribe(ProcessStarted, lambda _ev: self.wake.set())

    def poke(self) -> None:
        self.stale = True  # what this pass planned may be out of date: no claims ahead
        self.wake.set()

    def _changed(self, ev: Changed) -> None:
        """Any change of a job may let another start, but a claim: a pass makes every claim
        it can (one that may be followed asks for a pass once started: ProcessStarted)."""
        old, new = ev.old, ev.new
        if old is None or old.state is not JobState.QUEUED or new.state is not JobState.RUNNING:
            self.poke()

    def drain(self) -> None:  # admit nothing more
        self.draining = True

    # ---- admission --------------------------------------------------------------------

    def _candidates(self, now_wall: float, keys: Iterable[Key]) -> Iterator[admission.Candidate]:
        for _prio, job_id in keys:
            if job_id in self._claimed:  # by this round, ahead: a round skips these most
                continue
            job = self.table.jobs[job_id]
            if job.not_before > now_wall or job_id in self.table.pending or job.held:
                continue
            yield admission.Candidate(
                job_id=job_id,
                gpus=job.spec.gpus,
                vram_mb=self.book.vram_need(job.spec),
                projection=self.book.projection(job.spec),
                held_since=self.table.held_since.get(job_id),
                hold_reason=job.hold_reason,  # type: ignore[arg-type]
                share=job.spec.share,
                array=job.spec.array_id,
                cap=job.spec.max_running,
                cards=job.spec.cards,
                time_limit_s=job.spec.time_limit_s,
            )

    def running_use(self) -> list[admission.RunningJob]:
        return self._live_use() + list(self._claimed.values())

    def _live_use(self) -> list[admission.RunningJob]:
        return running_jobs(self.table.live, self.table.jobs, self.rss_mb, time.time())

    def _spec(self, job_id: int) -> JobSpec | None:
        job = self.table.jobs.get(job_id)
        return job.spec if job else None

    def _last_run(self, job_id: int) -> float:  # its kind's last success, s (inf: unknown)
        return last_run(self._spec(job_id), self.last_run_s)

    def set_paused(self, paused: bool) -> None:
        """`gpusv pause` / `resume`: while paused, no pass starts anything."""
        self.paused = paused

    def _read_once(self) -> Reading:
        """The host's memory and the running jobs' use, read once a round: the plans of
        one round share them (nothing awaits within a round; its own claims are added)."""
        if self._round is None:
            self._round = Reading(self.host(), admission.InUse.of(self._live_use()))
        return self._round

    def host(self) -> admission.HostMemory:
        return admission.HostMemory(
            limit_mb=self.limit_mb,
            available_mb=self.available_mb(),
            reserve_mb=self.reserve_mb,
        )

    def cpu_slots_free(self) -> int:
        lives = self.table.live
        used = sum(1 for r in lives.values() if not r.cards and not waiting_ahead(r, lives))
        return max(0, self.cfg.cpu_slots - used)

    def cards_now(self) -> list[admission.Card]:
        by_card: dict[int, list[int]] = {}
        for job_id, r in self.table.live.items():
            for c in r.cards:
                by_card.setdefault(c, []).append(job_id)
        return [evolve(c, running=tuple(by_card.get(c.index, ()))) for c in self.cards()]

    async def dispatch_pass(self) -> float | None:
        """One admission pass; returns seconds until the next backoff expires, if any.
        What asks for a pass while it runs sets `wake` (the next pass follows at once);
        a change of the table also sets `stale`, which stops its claims ahead."""
        self.wake, self.stale, self._round = anyio.Event(), False, None
        if self.draining or self.paused or not self.table.queue:
            if self.engine.store.problem is None:
                await self.waits.announce()
            return None
        if self.engine.store.problem is not None:  # nothing starts that could not be recorded
            return STORAGE_RECHECK_S
        now_wall, now, cards = time.time(), time.monotonic(), self.cards_now()
        free, full, settled = self._free(cards)
        if settled:  # the plan would do nothing
            await self._start_ahead(cards, now, now_wall)
            return await self.waits.after_pass(False, self._next_backoff(now_wall))
        plan = self._plan(cards, free, now, now_wall)
        if plan.starts or plan.holds:
            projections = {
                s.job_id: self.book.projection(self.table.jobs[s.job_id].spec) for s in plan.starts
            }
            uuids = {s.job_id: self.uuids_of(s.gpus) for s in plan.starts}
            now_too = not self.waits.leave(len(plan.starts), plan.holds)
            args = (plan.starts, plan.holds, projections, uuids, frozenset(full))
            await self.engine.do(Dispatch(*args, announce=now_too))
        if not self.stale:  # else the next pass plans anew
            await self._start_ahead(self.cards_now(), now, now_wall)
        return await self.waits.after_pass(bool(plan.starts), self._next_backoff(now_wall))

    def _free(self, cards: list[admission.Card]) -> tuple[dict[str, int], set[str], bool]:
        """Units free of each kind (cards, CPU slots, room in arrays); the devices none of
        which is free; whether every queued job is settled (held for a kind of device none
        of which is free) and no kind they wait for has a unit free."""
        free = {"gpu": sum(1 for c in cards if c.healthy and not c.running)}
        free["cpu"] = self.cpu_slots_free()
        full = {kind for kind, n in free.items() if n <= 0}
        free.update(self.table.array_room(self._claimed))
        kinds = self.table.queue.settled
        settled = not self.table.queue.live and all(n <= 0 for k, n in free.items() if kinds.get(k))
        return free, full, settled

    def refill_pause(self) -> float:
        """How long the next pass may wait for more ends: where all it could do is refill
        lines ahead, each of which has work in hand (daemon/lines.py)."""
        if self.draining or self.paused or not self.table.queue or self.engine.store.problem:
            return 0.0
        free, _full, settled = self._free(self.cards_now())
        if not settled and (free["gpu"] > 0 or free["cpu"] > 0):  # the plan may start one
            return 0.0
        return refill_pause(self._followable(time.time()))

    # ---- starting ahead ---------------------------------------------------------------

    async def _start_ahead(self, cards: list[admission.Card], now: float, now_wall: float) -> None:
        """Claim the next jobs of each card or CPU slot while its job still runs; its keeper
        starts each the moment the one in front exits, with no round trip through here.
        Admission decides as if the running job had left its place, but still counts its
        memory and VRAM, and those of the jobs claimed behind it. A round fills each line
        (docs/architecture.md, "Starting ahead"), each claim planned as the claims before
        it in the round leave the table, all in one Dispatch: one engine turn and one
        commit a round. Rounds follow until none is left to make."""
        limit = self.cfg.jobs.start_ahead_s
        while self.last_run_s and self.table.queue and self._may_claim():
            starts, projections, self._round = [], {}, None
            # A claim at a time behind each line in turn: the queue's order is the order in
            # which the cards come to its jobs.
            lines = self._followable(now_wall)
            try:
                while lines:
                    longer = []
                    for line in lines:
                        start = self._ahead_of(line.cards, cards, now, now_wall)
                        if start is None:
                            continue
                        starts.append(start := evolve(start, after=line.end))
                        projections[start.job_id] = self._claim(start)
                        spent = line.spent_s + self._last_run(start.job_id)
                        if line.room > 1 and spent <= limit:
                            end = (start.job_id, self.table.jobs[start.job_id].attempts + 1)
                            longer.append(Line(end, line.cards, line.room - 1, spent))
                    lines = longer
            finally:
                self._claimed.clear()
            if not starts:
                return
            uuids = {s.job_id: self.uuids_of(s.gpus) for s in starts}
            await self.engine.do(Dispatch(tuple(starts), (), projections, uuids, frozenset()))
            cards = self.cards_now()

    def _claim(self, start: admission.Start) -> Projection | None:
        """A claim of the round: the claims planned after it see its job taken and its
        memory, VRAM and array used."""
        spec = self.table.jobs[start.job_id].spec
        projection = self.book.projection(spec)
        self._claimed[start.job_id] = claim = admission.RunningJob(
            start.job_id,
            projection.projected_mb if projection else None,
            0,
            start.gpus,
            start.vram_reserved_mb,
            array=spec.array_id,
        )
        self._read_once().use.add(claim)
        return projection

    def _may_claim(self) -> bool:
        """Read before each round: while the last was committed, a drain, a pause, a
        storage fault or a change the next pass must plan from the start may have come
        (a job submitted while a card is idle goes there, not into a line)."""
        return not (self.draining or self.paused or self.engine.store.problem or self.stale)

    async def release_ahead(self, message: str, job_ids: Iterable[int] | None = None) -> None:
        """Jobs claimed ahead and still waiting (all, or those named) go back to the queue
        (`interrupted`, no budget): a pause lets nothing new start, not even what is lined
        up; and one behind a job that overran is not bound to its card."""
        chosen = (
            [j for j, _ in claimed_ahead(self.table.live)] if job_ids is None else list(job_ids)
        )
        # Their keepers drop the parked spawns first, with no write: while the database
        # refuses the Stops, a job in front that exits must still start nothing behind it.
        self.drop_ahead(chosen)
        for job_id in chosen:
            await self.engine.do(Stop(job_id, FailureReason.INTERRUPTED, {"message": message}))

    def _followable(self, now_wall: float) -> list[Line]:
        keeper = (self.can_follow, self.can_chain)
        lives, runs = self.table.live, self.last_run_s
        return followable(lives, self._spec, runs, self.cfg.jobs, keeper, now_wall)

    def _ahead_of(
        self, line_cards: tuple[int, ...], cards: list[admission.Card], now: float, now_wall: float
    ) -> admission.Start | None:
        """The job to claim at the end of a line on `line_cards` (one card, or none: a CPU
        slot)."""
        shown = [evolve(c, running=()) if (c.index,) == line_cards else c for c in cards]
        free = {"gpu": 1, "cpu": 0} if line_cards else {"gpu": 0, "cpu": 1}
        free.update(self.table.array_room(self._claimed))
        # Only its start is wanted, not the others' holds: the first settled job that this
        # round has not claimed is read alone, and more only where it does not fit.
        for start in self._plan(shown, free, now, now_wall, w=len(self._claimed)).starts:
            job = self.table.jobs[start.job_id]
            if start.gpus == line_cards and not job.spec.share:
                return start
        return None

    def _plan(
        self,
        cards: list[admission.Card],
        free: dict[str, int],
        now: float,
        now_wall: float,
        w: int = 8,
    ) -> admission.Plan:
        """admission.plan over the whole queue, reading of a kind's settled jobs only the
        first K + w when K units of it are free. That is the whole queue's plan if its
        starts used the K units up before the first job left out (those after it would be
        held as they are); else w grows and the plan is made again."""
        host, use = self._read_once()
        limit = self.cfg.host_memory.max_backfill_wait_s
        while True:
            ends = self.table.queue.ends(free, w)
            starving = [
                self.table.queue.starving(k, end, now, limit, self.table.held_since, self._possible)
                for k, end in ends.items()
            ]
            plan = admission.plan(
                self._candidates(now_wall, self.table.queue.keys(ends, starving)),
                cards=cards,
                cpu_slots_free=free["cpu"],
                host=host,
                running=use,
                now=now,
                max_backfill_wait_s=limit,
            )
            started = [(self.table.jobs[s.job_id], s.gpus) for s in plan.starts]
            cuts = self.table.queue.cuts(ends)
            idle = {c.index for c in cards if c.healthy and not c.running}
            # An array's jobs are alike: one held for a device or RAM, all would have been.
            blocked = {
                array_kind(job.spec.array_id)
                for h in plan.holds
                if h.reason != "array"
                and (job := self.table.jobs[h.job_id]).spec.array_id is not None
            }
            kept = {"gpu": len(plan.reserved)}  # idle for a wide job: no more may start there
            if all(
                k in blocked
                or used_before(started, k, key, idle) + kept.get(k, 0) >= free.get(k, 0)
                for k, key in cuts.items()
            ):
                return plan
            w = max(8, w * 8)

    def _possible(self, job_id: int) -> bool:
        """Whether the job could run once everything else has left (admission's rule)."""
        job = self.table.jobs[job_id]
        need = self.book.vram_need(job.spec)
        return admission.could_run(job.spec.gpus, need, self.cards(), job.spec.cards)

    def _next_backoff(self, now_wall: float) -> float | None:
        return self.table.queue.next_backoff(now_wall, self._backoff_current)

    def _backoff_current(self, job_id: int, not_before: float) -> bool:
        job = self.table.jobs.get(job_id)
        return job is not None and job.state is JobState.QUEUED and job.not_before == not_before

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            delay = await self.dispatch_pass()
            self.beat()
            with anyio.move_on_after(delay if delay is not None else 3600):
                await self.wake.wait()
            if pause := self.refill_pause():
                await anyio.sleep(pause)
