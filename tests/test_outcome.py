"""The end of an attempt: every failure reason against every budget state, from a table
whose expected values are written out, not computed."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts, end_of_attempt, failure, reclassified
from supervisor.core.records import Attempt

AT, NOW = "2026-01-01T00:00:00.000Z", 1000.0
HANG = {"source": "kernel_log", "lines": ["NVRM: Xid 79"]}
R = FailureReason


def job(ordinary_used: int, hang_used: int) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, retries=3, gpu_hang_retries=20)
    return Job(
        1, spec, JobState.RUNNING, attempts=1, ordinary_used=ordinary_used, gpu_hang_used=hang_used
    )


ATTEMPT = Attempt(1, 1, (0,), AT, "k")
KILLED = ExitStatus(None, signal.SIGKILL)
TERMED = ExitStatus(None, signal.SIGTERM)

FACTS: dict[str, Facts] = {
    "success": Facts(ExitStatus(0, None)),
    "success despite a hang line": Facts(ExitStatus(0, None), hang=HANG),
    "exit 1": Facts(ExitStatus(1, None)),
    "a signal": Facts(TERMED),
    "SIGKILL with OOM evidence": Facts(KILLED, oom="kernel_log"),
    "SIGKILL without evidence": Facts(KILLED),
    "exit 1 near a reset line": Facts(ExitStatus(1, None), hang=HANG),
    "SIGKILL near a reset line and an OOM": Facts(KILLED, hang=HANG, oom="kernel_log"),
    "killed for a hang": Facts(TERMED, killed_for=R.GPU_HANG, kill_evidence=HANG),
    "killed by the squeeze guard": Facts(KILLED, killed_for=R.OOM_KILLED),
    "cancelled while running": Facts(TERMED, killed_for=R.CANCELLED),
    "cancelled before it started": Facts(None, killed_for=R.CANCELLED),
    "drained while running": Facts(TERMED, killed_for=R.INTERRUPTED),
    "drained before it started": Facts(None, killed_for=R.INTERRUPTED),
    "spawn failed": Facts(None, spawn_error="executable not found: x"),
    "cancelled, and the spawn failed": Facts(None, killed_for=R.CANCELLED, spawn_error="e"),
}
BUDGETS = {"fresh": (0, 0), "ordinary spent": (3, 0), "hang spent": (0, 20), "both spent": (3, 20)}

# facts -> (reason, {budget state: (final state, ordinary used, hang used, delay)}).
# A retry's delay: 2**ordinary_used for the ordinary budget, 1 s for the hang budget,
# 0 for an interruption (charged to nothing).
Q, F, C, S = JobState.QUEUED, JobState.FAILED, JobState.CANCELLED, JobState.SUCCEEDED
ORDINARY = {"fresh": (Q, 1, 0, 1.0), "ordinary spent": (F, 3, 0, None)}
ORDINARY |= {"hang spent": (Q, 1, 20, 1.0), "both spent": (F, 3, 20, None)}
HANGS = {"fresh": (Q, 0, 1, 1.0), "ordinary spent": (Q, 3, 1, 1.0)}
HANGS |= {"hang spent": (F, 0, 20, None), "both spent": (F, 3, 20, None)}
DONE = {b: (S, *BUDGETS[b], None) for b in BUDGETS}
CANCEL = {b: (C, *BUDGETS[b], None) for b in BUDGETS}
REQUEUE = {b: (Q, *BUDGETS[b], 0.0) for b in BUDGETS}
NEVER = {b: (F, *BUDGETS[b], None) for b in BUDGETS}
EXPECTED: dict[str, tuple[FailureReason | None, dict[str, tuple[Any, ...]]]] = {
    "success": (None, DONE),
    "success despite a hang line": (None, DONE),
    "exit 1": (R.EXIT_NONZERO, ORDINARY),
    "a signal": (R.SIGNAL, ORDINARY),
    "SIGKILL with OOM evidence": (R.OOM_KILLED, ORDINARY),
    "SIGKILL without evidence": (R.SIGNAL, ORDINARY),
    "exit 1 near a reset line": (R.GPU_HANG, HANGS),
    "SIGKILL near a reset line and an OOM": (R.GPU_HANG, HANGS),
    "killed for a hang": (R.GPU_HANG, HANGS),
    "killed by the squeeze guard": (R.OOM_KILLED, ORDINARY),
    "cancelled while running": (R.CANCELLED, CANCEL),
    "cancelled before it started": (R.CANCELLED, CANCEL),
    "drained while running": (R.INTERRUPTED, REQUEUE),
    "drained before it started": (R.INTERRUPTED, REQUEUE),
    "spawn failed": (R.SPAWN_FAILED, NEVER),
    "cancelled, and the spawn failed": (R.CANCELLED, CANCEL),
}


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("case", FACTS)
def test_every_reason_against_every_budget(case: str, budget: str) -> None:
    reason, by_budget = EXPECTED[case]
    state, ordinary, hang, delay = by_budget[budget]
    out = end_of_attempt(job(*BUDGETS[budget]), ATTEMPT, FACTS[case], AT, NOW)
    assert out.attempt.reason == (reason.value if reason else None)
    assert (out.job.state, out.job.reason) == (state, reason)
    assert (out.job.ordinary_used, out.job.gpu_hang_used) == (ordinary, hang)
    assert out.job.not_before == (NOW + delay if delay else 0.0)
    assert out.attempt.ended_at == AT


def test_evidence_goes_with_its_reason() -> None:
    assert failure(FACTS["exit 1 near a reset line"]) == (R.GPU_HANG, HANG)
    assert failure(FACTS["SIGKILL with OOM evidence"]) == (R.OOM_KILLED, {"source": "kernel_log"})
    assert failure(FACTS["spawn failed"]) == (
        R.SPAWN_FAILED,
        {"message": "executable not found: x"},
    )
    assert failure(FACTS["exit 1"]) == (R.EXIT_NONZERO, None)


def test_the_events_say_what_happened() -> None:
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["exit 1 near a reset line"], AT, NOW)
    assert [e.kind for e in out.events] == ["gpu_hang", "exited", "retry_scheduled"]
    assert out.events[2].message == "retry in 1s (gpu_hang budget)"
    out = end_of_attempt(job(2, 0), ATTEMPT, FACTS["exit 1"], AT, NOW)
    assert [e.message for e in out.events] == [
        "exit_nonzero: exit code 1",
        "retry in 4s (ordinary budget)",
    ]
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["cancelled while running"], AT, NOW)
    assert [e.kind for e in out.events] == ["exited", "cancelled"]
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["drained while running"], AT, NOW)
    assert [e.kind for e in out.events] == ["exited", "interrupted"]


# ---- a reset line that arrives after the exit ------------------------------------------

ENDED = Attempt(1, 1, (0,), AT, "k", ended_at=AT, exit_code=1, reason="exit_nonzero")


def queued_retry(ordinary_used: int = 1, attempts: int = 1) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, retries=3, gpu_hang_retries=20)
    return Job(
        1,
        spec,
        JobState.QUEUED,
        reason=R.EXIT_NONZERO,
        attempts=attempts,
        ordinary_used=ordinary_used,
        not_before=NOW + 1,
    )


def test_a_late_line_moves_the_queued_retry_to_the_hang_budget() -> None:
    out = reclassified(queued_retry(), ENDED, HANG)
    assert out is not None
    assert (out.job.state, out.job.reason) == (JobState.QUEUED, R.GPU_HANG)
    assert (out.job.ordinary_used, out.job.gpu_hang_used) == (0, 1)
    assert (out.attempt.reason, out.attempt.evidence) == ("gpu_hang", HANG)
    assert out.attempt.exit_code == 1 and out.attempt.ended_at == AT
    assert [e.kind for e in out.events] == ["gpu_hang"]


@pytest.mark.parametrize(
    ("current", "attempt"),
    [
        (Job(1, queued_retry().spec, JobState.FAILED, attempts=1), ENDED),  # too late: it ended
        (queued_retry(attempts=2), ENDED),  # a later attempt is what is queued now
        (queued_retry(), Attempt(1, 1, (0,), AT, "k", reason="oom_killed")),  # not a crash
        (queued_retry(), Attempt(1, 1, (0,), AT, "k", reason="gpu_hang")),  # already a hang
    ],
)
def test_a_late_line_changes_nothing_it_cannot_explain(current: Job, attempt: Attempt) -> None:
    assert reclassified(current, attempt, HANG) is None
