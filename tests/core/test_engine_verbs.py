"""The engine's side of the everyday verbs: hold/release, and a --time stop that ends
the job as `timeout`, not retried."""

from __future__ import annotations

import signal

from supervisor.core import commands as c
from supervisor.core.admission import Start
from supervisor.core.draft import Step, Verdict
from supervisor.core.engine import step
from supervisor.core.jobs import ExitStatus, FailureReason, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.core.records import Attempt
from supervisor.core.table import Table

NOW = c.Now(1_700_000_000.0, 500.0)


def run(t: Table, cmd: c.Command) -> Step:
    out = step(t, cmd, NOW)
    t.apply(out.changes)
    return out


def events(out: Step) -> list[str]:
    return [e.kind for w in out.writes if isinstance(w, c.SaveJob) for e in w.events]


def spec(after: tuple[int, ...] = ()) -> JobSpec:
    return JobSpec(("train",), "/", {}, 1000, 1000, retries=5, after=after, time_limit_s=2.0)


def test_a_held_job_keeps_its_place_and_says_why_until_released() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.HoldJob(1, True, 1000))
    assert events(out) == ["held"] and t.jobs[1].held
    assert t.jobs[1].waiting_for == "held (gpusv release 1)" and len(t.queue) == 1
    assert run(t, c.HoldJob(1, True, 1000)).writes == []  # already held: nothing
    out = run(t, c.HoldJob(1, False, 0))
    assert events(out) == ["released"] and not t.jobs[1].held and t.jobs[1].waiting_for is None


def test_a_released_child_still_waits_for_its_parent() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.SubmitJobs((spec(after=(1,)),)))
    run(t, c.HoldJob(2, True, 1000))
    run(t, c.HoldJob(2, False, 1000))
    assert t.jobs[2].waiting_for == "waiting for job 1" and t.pending[2] == {1}


def test_a_running_job_is_not_held() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Dispatch((Start(1, (0,), 0),), ()))
    assert run(t, c.HoldJob(1, True, 1000)).writes == [] and not t.jobs[1].held


def test_past_its_time_limit_a_job_fails_as_timeout_and_is_not_retried() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Dispatch((Start(1, (0,), 0),), ()))
    run(t, c.Spawning(1, 1))
    run(t, c.Started(1, 1, 4242, 1.5))
    evidence = {"source": "time_limit", "limit_s": 2.0}
    assert [
        type(a).__name__ for a in run(t, c.Stop(1, FailureReason.TIMEOUT, evidence)).actions
    ] == ["Kill"]
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(None, signal.SIGTERM))))
    (changed,) = [a for a in out.actions if isinstance(a, c.Changed)]
    job = changed.new
    assert (job.state, job.reason, job.exit_code) == (JobState.FAILED, FailureReason.TIMEOUT, 143)
    messages = [e.message for w in out.writes if isinstance(w, c.SaveJob) for e in w.events]
    assert messages == ["timeout: past its wall-time limit of 2s"]


def test_hold_and_cancel_say_in_the_engine_turn_what_they_did_to_each_job() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec(), spec())))
    run(t, c.Dispatch((Start(1, (0,), 0),), ()))
    assert run(t, c.HoldJob(2, True, 1000)).verdicts == {2: Verdict(True, "held")}
    assert run(t, c.HoldJob(2, True, 1000)).verdicts == {2: Verdict(False, "is already held")}
    assert run(t, c.HoldJob(3, False, 1000)).verdicts == {3: Verdict(False, "is not held")}
    running = run(t, c.HoldJob(1, True, 1000)).verdicts
    assert running == {1: Verdict(False, "is running; only a queued job can be held")}
    assert run(t, c.HoldJob(2, False, 0)).verdicts == {2: Verdict(True, "released")}
    assert run(t, c.Cancel(2)).verdicts == {2: Verdict(True, "cancelled")}
    assert run(t, c.Cancel(1)).verdicts == {1: Verdict(True, "cancelling")}
    # A job that ended while the command waited for its turn gets no verdict: the
    # shell reads its end from the store and says so, instead of claiming it acted.
    assert run(t, c.Cancel(2)).verdicts == {}
    assert run(t, c.HoldJob(2, True, 1000)).verdicts == {}
    assert run(t, c.Cancel(99)).verdicts == {}


def test_clean_forgets_only_jobs_that_are_not_active() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.Forget((1, 7, 8)))
    assert out.writes == [c.MarkCleaned((7, 8), NOW.iso)]
    assert run(t, c.Forget((1,))).writes == []


def test_recovery_closes_the_open_attempts_of_jobs_that_are_no_longer_active() -> None:
    t = Table()
    orphan = Attempt(
        job_id=4, n=2, gpus=(0,), started_at="2026-01-01T00:00:00Z", mem_key="k", pid=123
    )
    out = run(t, c.Recover((), {}, frozenset(), {}, 5, orphans=(orphan,)))
    (closed,) = [w.attempt for w in out.writes if isinstance(w, c.CloseAttempt)]
    assert (closed.job_id, closed.n, closed.reason, closed.ended_at) == (
        4,
        2,
        "interrupted",
        NOW.iso,
    )
