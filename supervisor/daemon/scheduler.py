"""The dispatch loop: the in-memory queue, admission passes and hand-off to attempts.

SQLite rows are the truth; this module keeps only the active jobs (queued and running)
in memory, indexed so that a pass never scans the whole queue when nothing can start.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from supervisor.core import admission
from supervisor.core.jobqueue import DEVICE_HOLD, JobQueue, Key, kind_of, used_before
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState, transition
from supervisor.core.projection import MemObservation, Projection, project
from supervisor.daemon.clock import monotonic, now_iso
from supervisor.daemon.config import Config
from supervisor.daemon.memory import read_meminfo
from supervisor.daemon.store import Attempt, Event, Store

if TYPE_CHECKING:
    from supervisor.daemon.runner import ProcessHandle
    from supervisor.faults.watchdog import ProgressTracker

HISTORY = 50  # attempts per memory key kept in memory for projections
STORAGE_RECHECK_S = 1.0  # while the database cannot be written, look again this often


@dataclass
class Running:
    """A live attempt: persisted truth is in the store, this holds the runtime handles."""

    job_id: int
    attempt: Attempt
    cards: tuple[int, ...]
    seq: int
    started_mono: float
    projection: Projection | None
    vram_reserved_mb: int
    handle: ProcessHandle | None = None
    rss_mb: int = 0
    peak_rss_mb: int = 0
    kill_reason: FailureReason | None = None
    evidence: dict[str, Any] | None = None
    aborting: bool = False
    tracker: ProgressTracker | None = None
    oom_kills_at_start: int | None = None
    dispatched_at: float = field(default_factory=monotonic)


class Scheduler:
    def __init__(self, cfg: Config, store: Store) -> None:
        self.cfg = cfg
        self.store = store
        self.jobs: dict[int, Job] = {}
        self.queue = JobQueue()  # the queued jobs, in order
        self.running: dict[int, Running] = {}
        self.held_since: dict[int, float] = {}
        self.announced: dict[int, set[str]] = {}  # hold reasons already evented, per wait
        self.history: dict[str, list[MemObservation]] = {}
        self.pending_deps: dict[int, set[int]] = {}
        self.dependents: dict[int, set[int]] = {}
        self.waiters: dict[int, list[anyio.Event]] = {}
        # Told of every put as (old, new): hooks and metrics watch state changes here.
        self.observers: list[Callable[[Job | None, Job], None]] = []
        self.wake = anyio.Event()
        self.draining = False
        self.paused = (cfg.state_dir / "paused").exists()  # `gpusv pause` outlives restarts
        self.seq = 0
        self.cards: list[admission.Card] = []
        self.launch: Any = None  # set by the daemon: async (job, start) -> None
        self.beat: Any = lambda: None  # set by the daemon: the loop checked in
        self.tg: anyio.abc.TaskGroup | None = None
        total = read_meminfo().total_mb
        self.mem_total_mb = total
        self.limit_mb = cfg.host_memory.limit_mb(total)
        self.reserve_mb = cfg.host_memory.reserve.resolve(total)

    # ---- the in-memory index ----------------------------------------------------------

    def _enqueue(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.queue.add(job)

    def _dequeue(self, job: Job) -> None:
        self.queue.remove(job)
        self.held_since.pop(job.id, None)
        self.announced.pop(job.id, None)

    def put(self, job: Job) -> None:
        """Record a job's new state in memory: queue it, keep it running, or let it go."""
        old = self.jobs.get(job.id)
        if old is not None and old.state is JobState.QUEUED:
            self._dequeue(old)
        if job.state is JobState.QUEUED:
            self._enqueue(job)
        elif job.state is JobState.RUNNING:
            self.jobs[job.id] = job
        else:
            self.jobs.pop(job.id, None)
            self._finished(job)
        for observe in self.observers:
            observe(old, job)
        self.poke()

    def _finished(self, job: Job) -> None:
        for event in self.waiters.pop(job.id, []):
            event.set()
        for child in sorted(self.dependents.pop(job.id, set())):
            pending = self.pending_deps.get(child)
            if pending is None:
                continue
            pending.discard(job.id)
            if job.state is JobState.SUCCEEDED:
                self._show_deps(child)
            elif self.tg is not None:
                self.tg.start_soon(self.fail_dependency, child, job.id)

    def _show_deps(self, job_id: int) -> None:
        """`waiting_for` names the parents still to succeed; with none left, the job may run."""
        pending = self.pending_deps.get(job_id)
        if not pending:
            self.pending_deps.pop(job_id, None)
        job = self.jobs.get(job_id)
        if job is not None:
            waiting = f"waiting for job {', '.join(map(str, sorted(pending)))}" if pending else None
            self.jobs[job_id] = dataclasses.replace(job, waiting_for=waiting)

    def poke(self) -> None:
        self.wake.set()

    # ---- memory figures -----------------------------------------------------------------

    async def load_history(self, key: str) -> None:
        if key not in self.history:
            rows = await self.store.mem_history(key, HISTORY)
            self.history[key] = [
                MemObservation(r.peak_rss_mb, r.reason, r.scale, r.peak_vram_mb) for r in rows
            ]

    def observe(self, key: str, obs: MemObservation) -> None:
        rows = self.history.setdefault(key, [])
        rows.append(obs)
        del rows[:-HISTORY]

    def projection(self, spec: JobSpec) -> Projection | None:
        return project(
            self.history.get(spec.mem_key, []),
            declared_mb=spec.mem_mb,
            scale=spec.mem_scale,
            margin=self.cfg.host_memory.margin,
        )

    def vram_need(self, spec: JobSpec) -> int | None:
        if spec.vram_mb is not None:
            return spec.vram_mb
        peaks = [o.peak_vram_mb for o in self.history.get(spec.mem_key, []) if o.peak_vram_mb]
        return max(peaks[-10:]) if peaks else None

    # ---- admission --------------------------------------------------------------------

    def _candidates(self, now_wall: float, keys: Iterable[Key]) -> Iterator[admission.Candidate]:
        for _prio, job_id in keys:
            job = self.jobs[job_id]
            if job.not_before > now_wall or job_id in self.pending_deps or job.held:
                continue
            yield admission.Candidate(
                job_id=job_id,
                gpus=job.spec.gpus,
                vram_mb=self.vram_need(job.spec),
                projection=self.projection(job.spec),
                held_since=self.held_since.get(job_id),
            )

    def running_use(self) -> list[admission.RunningJob]:
        return [
            admission.RunningJob(
                job_id=r.job_id,
                projected_mb=r.projection.projected_mb if r.projection else None,
                rss_mb=r.rss_mb,
                gpus=r.cards,
                vram_reserved_mb=r.vram_reserved_mb,
            )
            for r in self.running.values()
        ]

    def host(self) -> admission.HostMemory:
        return admission.HostMemory(
            limit_mb=self.limit_mb,
            available_mb=read_meminfo().available_mb,
            reserve_mb=self.reserve_mb,
        )

    def cpu_slots_free(self) -> int:
        used = sum(1 for r in self.running.values() if not r.cards)
        return max(0, self.cfg.cpu_slots - used)

    def cards_now(self) -> list[admission.Card]:
        by_card: dict[int, list[int]] = {}
        for r in self.running.values():
            for c in r.cards:
                by_card.setdefault(c, []).append(r.job_id)
        return [dataclasses.replace(c, running=tuple(by_card.get(c.index, ()))) for c in self.cards]

    async def dispatch_pass(self) -> float | None:
        """One admission pass; returns seconds until the next backoff expires, if any."""
        if self.draining or self.paused or self.launch is None or not self.queue:
            return None
        if self.store.problem is not None:  # nothing starts that could not be recorded
            return STORAGE_RECHECK_S
        now_wall, now, cards = time.time(), monotonic(), self.cards_now()
        free = {"gpu": sum(1 for c in cards if c.healthy and not c.running)}
        free["cpu"] = self.cpu_slots_free()
        full = {kind for kind, n in free.items() if n <= 0}
        plan = self._plan(cards, free, now, now_wall)
        announce = [job for job in map(self._hold, plan.holds) if job is not None]
        if announce:
            events = [
                Event("queue_wait", j.waiting_for or "", {"reason": j.hold_reason})
                for j in announce
            ]
            await self.store.save_many(list(zip(announce, events, strict=True)), now_iso())
        self._settle(plan.holds, full)
        for start in plan.starts:
            self._claim(start)
        return self.queue.next_backoff(now_wall, self._backoff_current)

    def _settle(self, holds: Iterable[admission.Hold], full: set[str]) -> None:
        """Settle jobs held for their kind of device while none of it was free: in a pass
        that began so, or (needing one unit) in one that used the last unit up."""
        settle = []
        for hold in holds:
            job = self.jobs.get(hold.job_id)
            if job is None or job.state is not JobState.QUEUED:
                continue
            kind = kind_of(job)
            if hold.reason == DEVICE_HOLD[kind] and (kind in full or job.spec.gpus <= 1):
                settle.append(job)
        self.queue.settle(settle, self.held_since)

    def _plan(
        self, cards: list[admission.Card], free: dict[str, int], now: float, now_wall: float
    ) -> admission.Plan:
        """admission.plan over the whole queue, reading of a kind's settled jobs only the
        first K + w when K units of it are free. That is the whole queue's plan if its
        starts used the K units up before the first job left out (those after it would be
        held as they are); else w grows and the plan is made again."""
        host, running, w = self.host(), self.running_use(), 8
        limit = self.cfg.host_memory.max_backfill_wait_s
        while True:
            ends = self.queue.ends(free, w)
            starving = [
                self.queue.starving(k, end, now, limit, self.held_since, self._possible)
                for k, end in ends.items()
            ]
            plan = admission.plan(
                self._candidates(now_wall, self.queue.keys(ends, starving)),
                cards=cards,
                cpu_slots_free=free["cpu"],
                host=host,
                running=running,
                now=now,
                max_backfill_wait_s=limit,
            )
            started = [(self.jobs[s.job_id], s.gpus) for s in plan.starts]
            cuts = self.queue.cuts(ends)
            if all(used_before(started, k, key) >= free[k] for k, key in cuts.items()):
                return plan
            w *= 8

    def _possible(self, job_id: int) -> bool:
        """Whether the job could run once everything else has left (admission's rule)."""
        job = self.jobs[job_id]
        need = self.vram_need(job.spec) or 0
        fits = sum(1 for c in self.cards if c.healthy and c.vram_total_mb >= need)
        return fits >= job.spec.gpus

    def _backoff_current(self, job_id: int, not_before: float) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.state is JobState.QUEUED and job.not_before == not_before

    def _hold(self, hold: admission.Hold) -> Job | None:
        """Show why a job waits; the job to persist with a `queue_wait` event, once per
        reason per wait, however often the blocker changes back and forth meanwhile."""
        job = self.jobs.get(hold.job_id)
        if job is None:
            return None
        self.held_since.setdefault(job.id, monotonic())
        if (job.waiting_for, job.hold_reason) != (hold.message, hold.reason):
            self.queue.unsettle(job)  # if settled: its wait changed
            job = dataclasses.replace(job, waiting_for=hold.message, hold_reason=hold.reason)
            self.jobs[job.id] = job
            self.queue.set_hold(job.id, hold.reason)
        announced = self.announced.setdefault(job.id, set())
        if hold.reason in announced:
            return None
        announced.add(hold.reason)
        return job

    def _claim(self, start: admission.Start) -> None:
        """Book the cards and memory synchronously, then launch in the background."""
        job = self.jobs[start.job_id]
        self._dequeue(job)
        self.seq += 1
        attempt = Attempt(
            job_id=job.id,
            n=job.attempts + 1,
            gpus=start.gpus,
            started_at=now_iso(),
            mem_key=job.spec.mem_key,
            mem_scale=job.spec.mem_scale,
        )
        self.running[job.id] = Running(
            job_id=job.id,
            attempt=attempt,
            cards=start.gpus,
            seq=self.seq,
            started_mono=monotonic(),
            projection=self.projection(job.spec),
            vram_reserved_mb=start.vram_reserved_mb,
        )
        assert self.tg is not None
        self.tg.start_soon(self.launch, job, self.running[job.id])

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            self.tg = tg
            task_status.started()
            while True:
                self.wake = anyio.Event()
                delay = await self.dispatch_pass()
                self.beat()
                with anyio.move_on_after(delay if delay is not None else 3600):
                    await self.wake.wait()

    # ---- user actions -----------------------------------------------------------------

    async def submit(self, specs: list[JobSpec]) -> list[Job]:
        at = now_iso()
        for spec in {s.mem_key for s in specs}:
            await self.load_history(spec)
        ids = await self.store.insert_jobs(specs, at)
        jobs = [Job(id=i, spec=s, submitted_at=at) for i, s in zip(ids, specs, strict=True)]
        for job in jobs:
            if job.spec.after:  # no dispatch before its parents are known
                self.pending_deps[job.id] = set()
            self._enqueue(job)
        for job in jobs:
            if job.spec.after:
                await self._track_deps(job)
        self.poke()
        return jobs

    async def _track_deps(self, job: Job) -> None:
        """Wait for the parents still active; fail now if one ended without success.

        Ended parents are read from the store first (their state can no longer change);
        the active ones are then registered with no await in between, so none can end
        unseen."""
        ended: dict[int, JobState] = {}
        while missing := [p for p in job.spec.after if p not in self.jobs and p not in ended]:
            for parent in missing:
                row = await self.store.get_job(parent)
                ended[parent] = row.state if row else JobState.FAILED
        current = self.jobs.get(job.id)
        if current is None or current.state is not JobState.QUEUED:
            return  # cancelled meanwhile
        bad = [p for p in job.spec.after if p in ended and ended[p] is not JobState.SUCCEEDED]
        if bad:
            await self.fail_dependency(job.id, bad[0])
            return
        pending = {p for p in job.spec.after if p in self.jobs}
        for parent in pending:
            self.dependents.setdefault(parent, set()).add(job.id)
        self.pending_deps[job.id] = pending
        self._show_deps(job.id)

    async def fail_dependency(self, job_id: int, parent: int) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state is not JobState.QUEUED:
            return
        failed = transition(job, JobState.FAILED, now_iso(), FailureReason.DEPENDENCY_FAILED)
        message = f"dependency {parent} did not succeed"
        await self.store.save(failed, now_iso(), Event("dependency_failed", message))
        self.pending_deps.pop(job_id, None)  # only now: until then it must not be dispatched
        self.put(failed)

    async def cancel_queued(self, job: Job, why: str = "cancelled") -> Job:
        cancelled = transition(job, JobState.CANCELLED, now_iso(), FailureReason.CANCELLED)
        await self.store.save(cancelled, now_iso(), Event("cancelled", f"{why} while queued"))
        self.pending_deps.pop(job.id, None)
        self.put(cancelled)
        return cancelled

    def held_counts(self) -> dict[str, int]:
        """Queued jobs by hold reason."""
        return self.queue.held_counts()
