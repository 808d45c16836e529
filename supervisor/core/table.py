"""The engine's table: every active job (queued or running), its live attempt, and the
indexes a dispatch pass reads. Only the engine changes it, by applying what its step
returned once the writes are committed; everyone else reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from supervisor.core.jobqueue import JobQueue, refit
from supervisor.core.jobs import FailureReason, Job, JobState
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt

if TYPE_CHECKING:
    pass


class Phase(StrEnum):
    CLAIMED = "claimed"  # cards booked and the attempt stored; no process yet
    SPAWNING = "spawning"  # the runner is starting its process
    RUNNING = "running"  # it has a process


@dataclass(frozen=True)
class Live:
    """A job's current attempt, from its claim to its recorded end."""

    attempt: Attempt
    cards: tuple[int, ...]
    seq: int  # dispatch order
    phase: Phase
    projection: Projection | None
    vram_reserved_mb: int
    claimed_mono: float
    kill: FailureReason | None = None  # the daemon killed it, or will once it runs
    kill_since: float | None = None  # epoch of the stop's first signal: its grace counts from it
    evidence: dict[str, Any] | None = None
    machine: dict[str, Any] | None = None  # readings for a hang record, taken at detection
    after: tuple[int, int] | None = None  # started ahead: the (job, attempt) it follows


def waiting_ahead(live: Live, lives: Mapping[int, Live | None]) -> bool:
    """Claimed ahead of an attempt that still holds its place: it has no process yet,
    and its card or CPU slot is still the other attempt's."""
    if live.after is None or live.phase is Phase.RUNNING:
        return False
    before = lives.get(live.after[0])
    return before is not None and before.attempt.n == live.after[1]


def claimed_ahead(lives: Mapping[int, Live]) -> list[tuple[int, Live]]:
    """Jobs claimed ahead that still wait for the job in front, and are not being
    stopped already."""
    return [(j, r) for j, r in lives.items() if r.kill is None and waiting_ahead(r, lives)]


def line_of(job_id: int, lives: Mapping[int, Live]) -> list[int]:
    """The line that `job_id` ends, front first: from a job that runs, or that is being
    started (an ordinary start still under way, or one whose job in front has exited),
    through each job waiting ahead behind it. A spawn behind a front still being
    started reaches its keeper only after the front's (the runner's `Sending`)."""
    line, live = [job_id], lives[job_id]
    while waiting_ahead(live, lives):
        assert live.after is not None  # for mypy: waiting_ahead says so
        line.append(live.after[0])
        live = lives[live.after[0]]
    return line[::-1]


class Line(NamedTuple):
    """A line a job may be claimed behind: its end (job, attempt), its cards, how many
    more may join it, and the seconds its jobs are expected to take."""

    end: tuple[int, int]
    cards: tuple[int, ...]
    room: int
    spent_s: float


@dataclass(frozen=True)
class Room:
    """What a line may take: its front, how many more may join it, and the seconds its
    jobs are expected to take."""

    front: int
    room: int
    spent_s: float


def line_room(
    job_id: int, lives: Mapping[int, Live], depth: int, chains: bool, took: Callable[[int], float]
) -> Room:
    """The room in the line that `job_id` ends: up to `depth` waiting, or one behind a
    running job only, where its keeper cannot park a spawn behind a parked one (`chains`);
    and the seconds its jobs take by `took` (their kinds' last runs)."""
    line = line_of(job_id, lives)
    room = depth - len(line) + 1
    if not chains:
        room = min(room, 2 - len(line))
    return Room(line[0], room, sum(map(took, line)))


@dataclass
class Changes:
    """What one step changes; `Table.apply` makes it so."""

    jobs: dict[int, Job] = field(default_factory=dict)
    live: dict[int, Live | None] = field(default_factory=dict)
    held_since: dict[int, float] = field(default_factory=dict)
    announced: set[int] = field(default_factory=set)
    pending: dict[int, frozenset[int] | None] = field(default_factory=dict)
    dependents: list[tuple[int, int]] = field(default_factory=list)  # (parent, child)
    settle: list[int] = field(default_factory=list)  # held for a device none of was free
    settle_array: list[int] = field(default_factory=list)  # held by their array's cap
    left: set[int] = field(default_factory=set)  # left the queue (it may be back): a new wait
    rewaited: set[int] = field(default_factory=set)  # its wait changed: not settled
    seq: int | None = None
    next_id: int | None = None


class Table:
    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}  # active jobs only
        self.queue = JobQueue()  # the queued ones, in order
        self.live: dict[int, Live] = {}
        self.held_since: dict[int, float] = {}  # monotonic, per wait
        self.announced: set[int] = set()  # its wait has its queue_wait event
        self.pending: dict[int, frozenset[int]] = {}  # parents still to succeed
        self.dependents: dict[int, set[int]] = {}
        self.seq = 0
        self.next_id = 1

    def apply(self, c: Changes) -> list[tuple[Job | None, Job]]:
        """Make the changes; returns (old, new) for every job that changed."""
        left = {}  # what they waited as before is over, whatever they are now
        for job_id in c.left:
            was = self.jobs.get(job_id)
            if was is not None and was.state is JobState.QUEUED:
                self._leave_queue(was)
                left[job_id] = self.jobs.pop(job_id)
        changed = [(self._put(job) or left.get(job.id), job) for job in c.jobs.values()]
        for job_id in c.rewaited:
            if self._queued(job_id):
                self.queue.unsettle(self.jobs[job_id])
        for job_id, live in c.live.items():
            if live is None:
                self.live.pop(job_id, None)
            else:
                self.live[job_id] = live
        for job_id, parents in c.pending.items():
            if parents is None:
                self.pending.pop(job_id, None)
            else:
                self.pending[job_id] = parents
        for parent, child in c.dependents:
            self.dependents.setdefault(parent, set()).add(child)
        queued = [i for i in c.held_since if self._queued(i)]
        self.held_since.update({i: c.held_since[i] for i in queued})
        self.announced.update(i for i in c.announced if self._queued(i))
        settle = [self.jobs[i] for i in c.settle if self._queued(i)]
        if settle:
            self.queue.settle(settle, self.held_since)
        capped = [self.jobs[i] for i in c.settle_array if self._queued(i)]
        if capped:
            self.queue.settle_array(capped)
        self.seq = c.seq if c.seq is not None else self.seq
        self.next_id = c.next_id if c.next_id is not None else self.next_id
        return changed

    def _queued(self, job_id: int) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.state is JobState.QUEUED

    def _put(self, job: Job) -> Job | None:
        old = self.jobs.get(job.id)
        if old is not None and old.state is JobState.QUEUED and job.state is JobState.QUEUED:
            self.jobs[job.id] = job  # the same wait: keep its place and its bookkeeping
            if old.hold_reason != job.hold_reason or old.waiting_for != job.waiting_for:
                self.queue.unsettle(old)
                self.queue.set_hold(job.id, job.hold_reason)
            return old
        if old is not None and old.state is JobState.QUEUED:
            self._leave_queue(old)
        if job.state is JobState.QUEUED:
            self.jobs[job.id] = job
            self.queue.add(job)
        elif job.state is JobState.RUNNING:
            self.jobs[job.id] = job
        else:
            self.jobs.pop(job.id, None)
            self.live.pop(job.id, None)
            self.pending.pop(job.id, None)
            self.dependents.pop(job.id, None)
        return old

    def _leave_queue(self, job: Job) -> None:
        self.queue.remove(job)
        self.held_since.pop(job.id, None)
        self.announced.discard(job.id)

    def refit(self) -> None:
        """Its tables sized to what they hold now: called once the daemon falls idle, so
        that what a big batch grew them to goes back to the system (life/heap.py)."""
        refit(self.jobs, self.live, self.held_since, self.announced, self.pending, self.dependents)
        self.queue.refit()

    def held_counts(self) -> dict[str, int]:
        """Queued jobs by hold reason."""
        return self.queue.held_counts()

    def array_room(self, claimed: Iterable[int] = ()) -> dict[str, int]:
        """For each array with settled jobs: how many more of it may run now, counting
        the `claimed` jobs as running too (claims not committed yet)."""
        if not any(kind.startswith("array:") for kind in self.queue.settled):
            return {}  # no array's job is held by its cap: nothing to count
        running: Counter[int] = Counter()
        for job_id in (*self.live, *claimed):
            job = self.jobs.get(job_id)
            if job is not None and job.spec.array_id is not None:
                running[job.spec.array_id] += 1
        room = {}
        for kind, keys in self.queue.settled.items():
            job = self.jobs.get(keys[0][1]) if kind.startswith("array:") and keys else None
            if job is not None and job.spec.array_id is not None:
                room[kind] = max(0, (job.spec.max_running or 0) - running[job.spec.array_id])
        return room
