"""The end of an attempt whose keeper died, or whose cgroup could not be made: the
keeper named, an attempt of the ordinary budget spent; the kind of start failure kept."""

from __future__ import annotations

import signal

from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts, end_of_attempt, failure, keeper_death
from supervisor.core.records import Attempt

AT, NOW = "2026-01-01T00:00:00.000Z", 1000.0
R = FailureReason
ATTEMPT = Attempt(1, 1, (0,), AT, "k")
DIED = Facts(
    ExitStatus(None, signal.SIGKILL),
    killed_for=R.INTERRUPTED,
    kill_evidence=keeper_death("gpu0", 4242),
)


def job(ordinary_used: int) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, retries=3, gpu_hang_retries=20)
    return Job(1, spec, JobState.RUNNING, attempts=1, ordinary_used=ordinary_used)


def test_a_keeper_death_is_named_and_costs_an_attempt() -> None:
    died = DIED
    out = end_of_attempt(job(0), ATTEMPT, died, AT, NOW)
    assert [e.message for e in out.events] == [
        "interrupted: keeper gpu0 died (pid 4242)",
        "retry in 1s (ordinary budget)",
    ]
    assert out.attempt.evidence == {
        "message": "keeper gpu0 died (pid 4242)",
        "keeper": "gpu0",
        "keeper_pid": 4242,
    }
    spent = end_of_attempt(job(3), ATTEMPT, died, AT, NOW)
    assert (spent.job.state, spent.job.reason) == (JobState.FAILED, R.INTERRUPTED)
    assert [e.message for e in spent.events] == ["interrupted: keeper gpu0 died (pid 4242)"]
    assert "daemon stop" not in " ".join(e.message for e in (*out.events, *spent.events))


def test_a_spawn_error_keeps_its_kind() -> None:
    facts = Facts(None, spawn_error="cannot make cgroup /x: No such file", spawn_kind="cgroup")
    assert failure(facts) == (
        R.SPAWN_FAILED,
        {"message": "cannot make cgroup /x: No such file", "kind": "cgroup"},
    )
