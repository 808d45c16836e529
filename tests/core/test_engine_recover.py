"""Start-up's step for what a restart must carry through: a stop committed before it
(cancel, --time, a hang, a drain) and a claim that never started."""

from __future__ import annotations

from dataclasses import replace

from supervisor.core import commands as c
from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobState
from supervisor.core.outcome import Facts
from supervisor.core.records import Attempt, Event
from supervisor.core.table import Table
from tests.core.test_engine_steps import ISO, NOW, run, spec

STOPPED_AT = "2023-11-14T22:13:14.000Z"  # six seconds before NOW


def running_job(job_id: int, n: int = 1) -> Job:
    return Job(job_id, spec(), JobState.RUNNING, attempts=n, started_at=ISO, gpus=(0,))


def test_an_adopted_attempt_being_stopped_is_stopped_again_with_the_grace_already_spent() -> None:
    t = Table()
    job = running_job(3)
    attempt = Attempt(3, 1, (0,), ISO, "", pid=55, stop_reason="cancelled", stop_at=STOPPED_AT)
    out = run(t, c.Recover((job,), {3: attempt}, frozenset(), {}, 10, adopted={3: (55, None)}))
    assert out.actions == [c.Changed(None, job), c.Kill(3, None, NOW.wall - 6)]
    assert t.live[3].kill is FailureReason.CANCELLED and t.live[3].kill_since == NOW.wall - 6
    # Its end, whatever its status, is the cancel's.
    out = run(t, c.Ended(3, 1, Facts(ExitStatus(0, None))))
    assert [a.new.state for a in out.actions if isinstance(a, c.Changed)] == [JobState.CANCELLED]


def test_a_cancel_whose_process_went_with_its_keeper_ends_cancelled_and_runs_nothing_again() -> (
    None
):
    t = Table()
    job = running_job(3)
    attempt = Attempt(3, 1, (0,), ISO, "", pid=55, stop_reason="cancelled", stop_at=STOPPED_AT)
    out = run(t, c.Recover((job,), {3: attempt}, frozenset(), {}, 10))
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert save.job.state is JobState.CANCELLED and save.job.reason is FailureReason.CANCELLED
    assert save.ended_attempt is not None and save.ended_attempt.reason == "cancelled"
    assert 3 not in t.jobs and not t.queue and not t.live


def test_a_time_limit_stop_whose_process_went_with_its_keeper_ends_as_timeout() -> None:
    t = Table()
    job = running_job(4)
    attempt = Attempt(4, 1, (0,), ISO, "", pid=56, stop_reason="timeout", stop_at=STOPPED_AT)
    out = run(t, c.Recover((job,), {4: attempt}, frozenset(), {}, 10))
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert (save.job.state, save.job.reason) == (JobState.FAILED, FailureReason.TIMEOUT)


def test_a_claim_that_never_started_leaves_no_attempt_and_is_queued_again() -> None:
    t = Table()
    job = running_job(5, n=2)
    attempt = Attempt(5, 2, (1,), ISO, "")
    out = run(t, c.Recover((job,), {5: attempt}, frozenset(), {}, 10, never_started=frozenset({5})))
    requeued = replace(job, state=JobState.QUEUED, attempts=1)
    message = "claimed, but the daemon stopped before it started: queued again"
    assert out.writes == [
        c.DropAttempt(5, 2),
        c.SaveJob(requeued, ISO, (Event("requeued", message),)),
    ]
    assert t.jobs[5] == requeued and len(t.queue) == 1 and not t.live
    first = running_job(6)
    out = run(
        Table(),
        c.Recover(
            (first,),
            {6: Attempt(6, 1, (0,), ISO, "")},
            frozenset(),
            {},
            10,
            never_started=frozenset({6}),
        ),
    )
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert (save.job.attempts, save.job.gpus, save.job.started_at) == (0, (), None)
