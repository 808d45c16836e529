"""A step's working copy: the table as the commands being stepped have changed it so
far, and what the step will write and do. The engine (`core/engine.py`) decides with it.
Every read of the table goes through it, so that a command stepped after others in one
draft sees what they changed."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from supervisor.core import outcome
from supervisor.core.commands import Action, AttemptEnded, Changed, Now, SaveJob, Write
from supervisor.core.dependencies import blocks, parents, waiting_text
from supervisor.core.evolve import evolve
from supervisor.core.hang_record import hang_record
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState, transition
from supervisor.core.outcome import Facts
from supervisor.core.records import Attempt, Event
from supervisor.core.table import Changes, Live, Table


@dataclass(frozen=True)
class Verdict:
    """What a client's command did to one job, decided in the engine's turn: the client is
    told this, never what the shell guessed before the turn (the job may have ended while
    the command waited for it)."""

    ok: bool
    text: str  # "cancelled", "cancelling", "held", "released", or why not


@dataclass
class Step:
    changes: Changes = field(default_factory=Changes)
    writes: list[Write] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # job id -> for the client


class Draft:
    """The table as this step has changed it so far."""

    def __init__(self, table: Table, now: Now) -> None:
        self.table = table
        self.now = now
        self.out = Step()
        self.changes = self.out.changes

    def job(self, job_id: int) -> Job | None:
        return self.changes.jobs.get(job_id) or self.table.jobs.get(job_id)

    def live(self, job_id: int) -> Live | None:
        if job_id in self.changes.live:
            return self.changes.live[job_id]
        return self.table.live.get(job_id)

    def lives(self) -> Mapping[int, Live | None]:
        """Every live attempt as changed so far (None: ended in this step)."""
        return ChainMap(self.changes.live, cast(dict[int, Live | None], self.table.live))

    def pending(self, job_id: int) -> frozenset[int] | None:
        if job_id in self.changes.pending:
            return self.changes.pending[job_id]
        return self.table.pending.get(job_id)

    def set_job(self, job: Job) -> None:
        """The job as changed. What a change does to the queue's bookkeeping is kept, so
        that commands stepped together leave the table as they would one by one: a job
        that leaves the queue loses its wait (its hold's start, its announcement, its
        settling), and one whose wait changes is no longer settled."""
        old = self.job(job.id)
        if old is not None and old.state is JobState.QUEUED:
            if job.state is not JobState.QUEUED:
                self.changes.left.add(job.id)
                self.changes.held_since.pop(job.id, None)
                self.changes.announced.discard(job.id)
                self._unsettle(job.id)
            elif (old.waiting_for, old.hold_reason) != (job.waiting_for, job.hold_reason):
                self._unsettle(job.id)
        self.changes.jobs[job.id] = job

    def _unsettle(self, job_id: int) -> None:
        self.changes.rewaited.add(job_id)
        if job_id in self.changes.settle:
            self.changes.settle = [i for i in self.changes.settle if i != job_id]
        if job_id in self.changes.settle_array:
            self.changes.settle_array = [i for i in self.changes.settle_array if i != job_id]

    def held_since(self, job_id: int) -> float | None:
        if job_id in self.changes.held_since or job_id in self.changes.left:
            return self.changes.held_since.get(job_id)
        return self.table.held_since.get(job_id)

    def announced(self, job_id: int) -> bool:
        return job_id in self.changes.announced or (
            job_id not in self.changes.left and job_id in self.table.announced
        )

    def put(
        self, job: Job, *events: Event, new: Attempt | None = None, end: Attempt | None = None
    ) -> None:
        old = self.job(job.id)
        self.set_job(job)
        if events or new is not None or end is not None:
            self.out.writes.append(SaveJob(job, self.now.iso, events, new, end))
        self.out.actions.append(Changed(old, job))
        if job.state.terminal:
            self._ended(job)

    def _ended(self, job: Job) -> None:
        """Tell the jobs that wait for this one: one fewer parent, or a failed one."""
        self.changes.pending[job.id] = None
        added = {child for parent, child in self.changes.dependents if parent == job.id}
        for child in sorted(self.table.dependents.get(job.id, set()) | added):
            parents = self.pending(child)
            if parents is None:
                continue
            spec = self._spec(child)
            if spec is not None and blocks(spec, job.id, job.state):
                self.fail_dependency(child, job.id)
            else:
                self.waiting_on(child, parents - {job.id})

    def waiting_on(self, job_id: int, parents: frozenset[int]) -> None:
        job = self.job(job_id)
        if job is None or job.state is not JobState.QUEUED:
            return
        self.changes.pending[job_id] = parents or None
        self.set_job(evolve(job, waiting_for=waiting_text(parents)))

    def fail_dependency(self, job_id: int, parent: int) -> None:
        job = self.job(job_id)
        if job is None or job.state is not JobState.QUEUED:
            return
        failed = transition(job, JobState.FAILED, self.now.iso, FailureReason.DEPENDENCY_FAILED)
        self.put(failed, Event("dependency_failed", f"dependency {parent} did not succeed"))

    def _spec(self, job_id: int) -> JobSpec | None:
        job = self.job(job_id)
        return None if job is None else job.spec

    def track(self, job: Job, ended: dict[int, JobState]) -> None:
        """Wait for the parents still active; fail now if an `--after` one ended without
        success (one not found counts as failed)."""
        bad = [
            p
            for p in job.spec.after
            if self.job(p) is None and blocks(job.spec, p, ended.get(p, JobState.FAILED))
        ]
        if bad:
            self.changes.pending[job.id] = frozenset()  # never dispatched before it fails
            self.fail_dependency(job.id, bad[0])
            return
        active = frozenset(p for p in parents(job.spec) if self.job(p) is not None)
        self.changes.dependents.extend((p, job.id) for p in active)
        self.waiting_on(job.id, active)

    def end(self, job: Job, live: Live, facts: Facts) -> None:
        """Close the attempt as the facts say, and move the job on."""
        done = outcome.end_of_attempt(job, live.attempt, facts, self.now.iso, self.now.wall)
        self.changes.live[job.id] = None
        self.put(done.job, *done.events, end=done.attempt)
        self.out.actions.append(AttemptEnded(done.job, done.attempt, live.cards))
        if done.attempt.reason == FailureReason.GPU_HANG.value:
            self.out.writes.append(hang_record(done.job, done.attempt, live.machine, self.now))
