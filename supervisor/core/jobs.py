"""The job model: states, failure reasons, the legal transitions, and exit classification.

Every other module may import this one; it imports only the standard library and
supervisor.core.evolve (itself standard library only).
"""

from __future__ import annotations

import os
import signal as _signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from supervisor.core.evolve import evolve


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class FailureReason(StrEnum):
    EXIT_NONZERO = "exit_nonzero"
    SIGNAL = "signal"
    OOM_KILLED = "oom_killed"
    GPU_HANG = "gpu_hang"
    INTERRUPTED = "interrupted"
    SPAWN_FAILED = "spawn_failed"  # a start that can never succeed: not retried
    # A start that failed for a passing cause (the host short of processes, memory,
    # descriptors or disk; its keeper reconnecting): retried, ordinary budget. A job
    # whose budget such failures spend ends `spawn_failed`.
    SPAWN_RETRY = "spawn_retry"
    CANCELLED = "cancelled"
    DEPENDENCY_FAILED = "dependency_failed"
    TIMEOUT = "timeout"  # ran past its --time wall-time limit


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# RUNNING -> QUEUED is a retry or an interrupted attempt; QUEUED -> FAILED is a failed
# dependency or a spawn that never produced a process.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, job_id: int, frm: JobState, to: JobState) -> None:
        super().__init__(f"job {job_id}: illegal transition {frm.value} -> {to.value}")
        self.job_id = job_id
        self.frm = frm
        self.to = to


@dataclass(frozen=True)
class JobSpec:
    """What the submitter asked for. Only `gpusv update` changes it afterwards, and only
    a queued job's priority, time limit and cards (core/update.py)."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    owner_uid: int
    owner_gid: int
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    vram_mb: int | None = None
    mem_mb: int | None = None
    mem_key: str = ""
    mem_scale: float | None = None
    retries: int = 3
    gpu_hang_retries: int = 20
    progress_timeout_s: float | None = None
    progress_regex: str | None = None
    priority: int = 0
    after: tuple[int, ...] = ()  # must succeed first (an array's id: every index of it)
    after_any: tuple[int, ...] = ()  # must end first, however they end
    time_limit_s: float | None = None  # per attempt; past it: stopped, reason timeout
    stall_timeout_s: float | None = None  # no progress this long at any utilization: hung
    share: bool = False  # may share its one card with other shared jobs, VRAM permitting
    array_id: int | None = None  # the array it belongs to: the id of the array's first job
    array_index: int | None = None
    max_running: int | None = None  # at most this many of its array run at once
    cards: tuple[int, ...] | None = None  # pinned: it runs only on these cards (None: any)


@dataclass(frozen=True)
class Job:
    id: int
    spec: JobSpec
    state: JobState = JobState.QUEUED
    submitted_at: str = ""
    started_at: str | None = None
    ended_at: str | None = None
    waiting_for: str | None = None
    hold_reason: str | None = None
    reason: FailureReason | None = None
    exit_code: int | None = None
    ordinary_used: int = 0
    gpu_hang_used: int = 0
    gpus: tuple[int, ...] = ()
    attempts: int = 0
    not_before: float = 0.0  # wall-clock epoch seconds; retry backoff
    progress: str | None = None
    held: bool = False  # `gpusv hold`: a queued job that must not start


def transition(
    job: Job, to: JobState, at: str, reason: FailureReason | None = None, **changes: Any
) -> Job:
    """Return the job in state `to`, stamped at `at`; raise IllegalTransition if not allowed."""
    if to not in TRANSITIONS[job.state]:
        raise IllegalTransition(job.id, job.state, to)
    stamps: dict[str, Any] = {}
    if to is JobState.RUNNING:
        stamps["started_at"] = job.started_at or at
        stamps["waiting_for"] = None
        stamps["hold_reason"] = None
    elif to.terminal:
        stamps["ended_at"] = at
        stamps["waiting_for"] = None
        stamps["hold_reason"] = None
    return evolve(job, state=to, reason=reason, **{**stamps, **changes})


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None  # None when killed by a signal
    signal: int | None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            return cls(None, os.WTERMSIG(status))
        return cls(os.WEXITSTATUS(status), None)

    @property
    def shell_code(self) -> int:
        """The code a shell would report: 128+N for a signal."""
        return self.exit_code if self.exit_code is not None else 128 + (self.signal or 0)


def classify_exit(
    status: ExitStatus, *, oom_evidence: bool = False, hang_evidence: bool = False
) -> FailureReason | None:
    """None for success; else why the attempt failed. A hang outranks everything else:
    a process that died after its GPU reset died because of the reset."""
    if hang_evidence:
        return FailureReason.GPU_HANG
    if status.signal is not None:
        if status.signal == _signal.SIGKILL and oom_evidence:
            return FailureReason.OOM_KILLED
        return FailureReason.SIGNAL
    if status.exit_code == 0:
        return None
    return FailureReason.EXIT_NONZERO


# Reasons whose attempts never count against any budget.
UNCHARGED = frozenset({FailureReason.INTERRUPTED, FailureReason.CANCELLED})
