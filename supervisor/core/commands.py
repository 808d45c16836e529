"""What goes into the engine's step and what comes out of it: commands (facts and
requests, no decisions), writes (what the store commits, in one transaction) and actions
(what the shell does once the writes are durable). Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from supervisor.core.admission import Hold, Start
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt, Event, iso_at


@dataclass(frozen=True)
class Now:
    wall: float  # epoch seconds: stamps and retry backoff
    mono: float  # monotonic seconds: how long a job has been held

    @cached_property  # a step stamps many rows with the same moment
    def iso(self) -> str:
        return iso_at(self.wall)


# ---- commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitJobs:
    specs: tuple[JobSpec, ...]
    ended_parents: dict[int, JobState] = field(default_factory=dict)  # --after, not active
    request_id: str | None = None  # the client's: kept with the jobs, so a repeat finds them
    # Events recorded with each job after `submitted`, by the spec's position (a need
    # larger than the host's limit); empty: none for any.
    notes: tuple[tuple[Event, ...], ...] = ()
    # A parent that is a job of an array -> the array's jobs (core/dependencies.py)
    arrays: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Dispatch:
    """One admission pass's plan: jobs to claim, holds to show."""

    starts: tuple[Start, ...]
    holds: tuple[Hold, ...]
    projections: dict[int, Projection | None] = field(default_factory=dict)
    uuids: dict[int, tuple[str, ...]] = field(default_factory=dict)  # the cards' UUIDs
    full: frozenset[str] = frozenset()  # kinds of device ("gpu", "cpu") none of which was free
    # False: the holds are shown (waiting_for) and settled, but their queue_wait events
    # are left for a later Dispatch to write (daemon/waits.py): a pass that claims a few
    # jobs and holds thousands commits its claims without their rows.
    announce: bool = True


@dataclass(frozen=True)
class Spawning:
    """The runner is about to start a claimed attempt's process."""

    job_id: int
    n: int


@dataclass(frozen=True)
class Started:
    job_id: int
    n: int
    pid: int
    pid_start: float | None


@dataclass(frozen=True)
class Ended:
    job_id: int
    n: int
    facts: Facts


@dataclass(frozen=True)
class Cancel:
    job_id: int


@dataclass(frozen=True)
class Stop:
    """Kill a running attempt for a reason of the daemon's: a hang, the squeeze guard, a
    drain. `reprobe` is a card to query once the tree is gone."""

    job_id: int
    reason: FailureReason
    evidence: dict[str, Any] | None = None
    reprobe: int | None = None


@dataclass(frozen=True)
class Reclassify:
    """A reset line for a card arrived after an attempt on it had ended."""

    job_id: int
    attempt: Attempt
    evidence: dict[str, Any]
    machine: dict[str, Any] = field(default_factory=dict)  # the hang record's readings


@dataclass(frozen=True)
class HangSeen:
    """Hang evidence for a running attempt's card, with the machine read at that moment."""

    job_id: int
    card: int
    evidence: dict[str, Any]
    machine: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    job_id: int
    match: str


@dataclass(frozen=True)
class HoldJob:
    """`gpusv hold` (held=True) or `release` of a queued job, by that uid."""

    job_id: int
    held: bool
    by_uid: int


@dataclass(frozen=True)
class UpdateJob:
    """`gpusv update` of a queued job, by that uid. None leaves a value as it is;
    `cards` () pins it to no card in particular again."""

    job_id: int
    by_uid: int
    priority: int | None = None
    time_limit_s: float | None = None
    cards: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Recover:
    """Start-up: the active jobs as stored, with what the shell found of their attempts."""

    jobs: tuple[Job, ...]
    open_attempts: dict[int, Attempt]
    killed: frozenset[int]  # jobs whose leftover processes were killed
    ended_parents: dict[int, JobState]
    next_id: int
    # Jobs whose attempt a keeper still holds (running, or ended while no daemon ran),
    # with the (pid, start time) its keeper recorded: they stay running under the same
    # attempt, and their end comes as an Ended.
    adopted: dict[int, tuple[int, float | None]] = field(default_factory=dict)
    projections: dict[int, Projection | None] = field(default_factory=dict)  # adopted jobs'
    vram_reserved: dict[int, int] = field(default_factory=dict)
    # Open attempts of jobs no longer active (the daemon died between an attempt's end and
    # its job's): closed `interrupted`, so that no attempt stays open for ever.
    orphans: tuple[Attempt, ...] = ()
    # Jobs whose open attempt has neither a pid nor a keeper's record: claimed, never
    # started. The claim is released: no attempt row, nothing charged, queued again.
    never_started: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Forget:
    """`gpusv clean`: finished jobs the store found, to be marked cleaned."""

    ids: tuple[int, ...]


Command = (
    SubmitJobs
    | Dispatch
    | Spawning
    | Started
    | Ended
    | Cancel
    | Stop
    | Reclassify
    | HangSeen
    | Progress
    | HoldJob
    | UpdateJob
    | Recover
    | Forget
)


# ---- writes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class InsertJob:
    job: Job
    notes: tuple[Event, ...] = ()  # events after `submitted`


@dataclass(frozen=True)
class SaveJob:
    job: Job
    at: str  # the events' stamp
    events: tuple[Event, ...] = ()
    new_attempt: Attempt | None = None
    ended_attempt: Attempt | None = None


@dataclass(frozen=True)
class SaveSpec:
    """A queued job's spec as `update` changed it."""

    job: Job


@dataclass(frozen=True)
class SetPid:
    attempt: Attempt  # its pid, and its start (later than its claim when started ahead)
    job_started_at: str | None = None  # the job's own start, when this attempt moved it


@dataclass(frozen=True)
class RecordHang:
    row: dict[str, Any]


@dataclass(frozen=True)
class CloseAttempt:
    """An attempt ended without a change to its job (see Recover.orphans)."""

    attempt: Attempt


@dataclass(frozen=True)
class RecordStop:
    """The stop intent of a running attempt (see Attempt.stop_reason)."""

    job_id: int
    n: int
    reason: str
    at: str
    evidence: dict[str, Any] | None = None


@dataclass(frozen=True)
class DropAttempt:
    """A claim whose process never started: no attempt row may say it ran."""

    job_id: int
    n: int


@dataclass(frozen=True)
class MarkCleaned:
    ids: tuple[int, ...]
    at: str


Write = (
    InsertJob
    | SaveJob
    | SetPid
    | RecordHang
    | CloseAttempt
    | MarkCleaned
    | RecordStop
    | DropAttempt
    | SaveSpec
)


# ---- actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spawn:
    job: Job
    attempt: Attempt
    cards: tuple[int, ...]
    seq: int  # dispatch order: the newest is the OOM killer's first victim
    after: tuple[int, int] | None = None  # its keeper starts it once this attempt exits


@dataclass(frozen=True)
class Kill:
    job_id: int
    reprobe: int | None = None
    since: float | None = None  # epoch of the stop's first signal: the grace counts from it


@dataclass(frozen=True)
class ProcessStarted:
    job_id: int
    pid: int


@dataclass(frozen=True)
class Changed:
    old: Job | None
    new: Job


@dataclass(frozen=True)
class AttemptEnded:
    job: Job  # as it now stands
    attempt: Attempt  # closed
    cards: tuple[int, ...]


Action = Spawn | Kill | ProcessStarted | Changed | AttemptEnded
