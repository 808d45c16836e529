"""A start that failed for a passing cause is retried within the ordinary budget; one
that can never succeed is `spawn_failed` at once, and so is the last passing failure."""

from __future__ import annotations

from typing import Any

from supervisor.core import retry
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts, end_of_attempt, failure
from supervisor.core.records import Attempt

AT, NOW = "2026-01-01T00:00:00.000Z", 1000.0
ATTEMPT = Attempt(1, 1, (0,), AT, "k")
EAGAIN = "cannot start the job: Resource temporarily unavailable"
PASSING = Facts(None, spawn_error=EAGAIN, spawn_transient=True)
FOR_GOOD = Facts(None, spawn_error="executable not found: x")


def job(ordinary_used: int) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, retries=3, gpu_hang_retries=20)
    return Job(1, spec, JobState.RUNNING, attempts=1, ordinary_used=ordinary_used)


def test_a_passing_spawn_failure_is_spawn_retry_and_backs_off_on_the_ordinary_budget() -> None:
    assert failure(PASSING)[0] is FailureReason.SPAWN_RETRY
    for used, delay in ((0, 1.0), (1, 2.0), (2, 4.0)):
        out = end_of_attempt(job(used), ATTEMPT, PASSING, AT, NOW)
        assert out.attempt.reason == "spawn_retry"
        assert (out.job.state, out.job.reason) == (JobState.QUEUED, FailureReason.SPAWN_RETRY)
        assert out.job.ordinary_used == used + 1 and out.job.not_before == NOW + delay
        assert [e.kind for e in out.events] == ["exited", "retry_scheduled"]
        assert "Resource temporarily unavailable" in out.events[0].message


def test_once_the_budget_is_spent_the_job_fails_as_spawn_failed() -> None:
    out = end_of_attempt(job(3), ATTEMPT, PASSING, AT, NOW)
    assert out.attempt.reason == "spawn_retry"  # what this attempt met
    assert (out.job.state, out.job.reason) == (JobState.FAILED, FailureReason.SPAWN_FAILED)


def test_a_start_that_can_never_succeed_is_spawn_failed_and_never_retried() -> None:
    out = end_of_attempt(job(0), ATTEMPT, FOR_GOOD, AT, NOW)
    assert (out.job.state, out.job.reason) == (JobState.FAILED, FailureReason.SPAWN_FAILED)
    assert out.job.ordinary_used == 0
    budgets: dict[str, Any] = {"ordinary_budget": 3, "gpu_hang_used": 0, "gpu_hang_budget": 20}
    never = retry.next_action(FailureReason.SPAWN_FAILED, ordinary_used=0, **budgets)
    assert isinstance(never, retry.Fail)
