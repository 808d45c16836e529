"""Starting ahead, in the engine: a job claimed behind one that still holds its card or
CPU slot, started by its keeper once that one exits (docs/architecture.md)."""

from __future__ import annotations

from supervisor.core import commands as c
from supervisor.core.admission import Start
from supervisor.core.engine import step
from supervisor.core.jobs import ExitStatus, FailureReason, JobState
from supervisor.core.outcome import Facts
from supervisor.core.table import Phase, Table, waiting_ahead
from tests.core.test_engine_steps import HANG, ISO, NOW, run, running, spec

LATER = c.Now(1_700_000_030.0, 530.0)
LATER_ISO = "2023-11-14T22:13:50.000Z"


def ahead(t: Table) -> None:
    """Job 1 up on card 0; job 2 claimed behind it and handed to its keeper."""
    running(t, spec())
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Dispatch((Start(2, (0,), 0, after=(1, 1)),), ()))
    run(t, c.Spawning(2, 1))


def test_a_job_claimed_ahead_is_spawned_after_the_one_it_follows_and_says_so() -> None:
    t = Table()
    running(t, spec())
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.Dispatch((Start(2, (0,), 0, after=(1, 1)),), ()))
    (spawn,) = [a for a in out.actions if isinstance(a, c.Spawn)]
    assert spawn.after == (1, 1) and spawn.cards == (0,)
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    (event,) = save.events
    assert event.message == "attempt 1 on GPUs 0, starting once job 1 exits"
    assert event.data == {"gpus": [0], "after": 1}
    assert t.live[2].after == (1, 1) and waiting_ahead(t.live[2], t.live)
    assert not waiting_ahead(t.live[1], t.live)


def test_it_stops_waiting_once_the_job_before_it_has_ended() -> None:
    t = Table()
    ahead(t)
    run(t, c.Ended(1, 1, Facts(ExitStatus(0, None))))
    assert 1 not in t.live and not waiting_ahead(t.live[2], t.live)


def test_its_start_is_when_its_process_came_up_not_when_it_was_claimed() -> None:
    t = Table()
    ahead(t)
    run(t, c.Ended(1, 1, Facts(ExitStatus(0, None))))
    out = step(t, c.Started(2, 1, 202, LATER.wall - 0.5), LATER)  # the keeper's stamp
    t.apply(out.changes)
    (pid,) = out.writes
    assert isinstance(pid, c.SetPid)
    came_up = "2023-11-14T22:13:49.500Z"
    assert pid.attempt.started_at == came_up and pid.job_started_at == came_up
    assert t.jobs[2].started_at == came_up and t.live[2].attempt.started_at == came_up
    assert t.live[2].phase is Phase.RUNNING


def test_its_start_taken_before_the_end_in_front_still_comes_after_that_end() -> None:
    """The keeper reaps the job in front, then starts the one behind; the daemon may take
    the start first. Both stamps are the keeper's, so the order of the records holds."""
    t = Table()
    ahead(t)
    exited, came_up = LATER.wall - 0.020, LATER.wall - 0.010
    run(t, c.Started(2, 1, 202, came_up))
    out = step(t, c.Ended(1, 1, Facts(ExitStatus(0, None), exited_at=exited)), LATER)
    t.apply(out.changes)
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert save.ended_attempt is not None
    assert save.ended_attempt.ended_at == "2023-11-14T22:13:49.980Z"
    assert t.live[2].attempt.started_at == "2023-11-14T22:13:49.990Z"
    assert t.live[2].attempt.started_at >= save.ended_attempt.ended_at


def test_an_end_is_stamped_when_the_keeper_saw_it_never_before_its_start() -> None:
    t = Table()
    running(t, spec())
    out = step(t, c.Ended(1, 1, Facts(ExitStatus(3, None), exited_at=LATER.wall - 1)), LATER)
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert save.ended_attempt is not None
    assert save.ended_attempt.ended_at == "2023-11-14T22:13:49.000Z"  # not LATER_ISO
    t2 = Table()  # a clock that stepped back: the end is never stamped before the start
    running(t2, spec())
    out = step(t2, c.Ended(1, 1, Facts(ExitStatus(0, None), exited_at=0.0)), LATER)
    (save,) = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert save.ended_attempt is not None and save.ended_attempt.ended_at == ISO  # its start


def test_a_job_not_claimed_ahead_keeps_its_claim_as_its_start() -> None:
    t = Table()
    running(t, spec())
    assert t.jobs[1].started_at == ISO
    (pid,) = step(t, c.Started(1, 1, 101, None), LATER).writes
    assert isinstance(pid, c.SetPid) and pid.job_started_at is None
    assert pid.attempt.started_at == ISO


def test_cancelling_it_while_it_waits_tells_its_keeper_to_drop_it() -> None:
    t = Table()
    ahead(t)
    out = run(t, c.Cancel(2))
    assert c.Kill(2, None, NOW.wall) in out.actions and t.live[2].kill is FailureReason.CANCELLED
    run(t, c.Ended(2, 1, Facts(None)))  # its keeper dropped it: no process ran
    assert 2 not in t.jobs and 2 not in t.live  # ended, no longer active
    assert 1 in t.live and t.live[1].kill is None  # the job before it runs on


def test_a_cancelled_follower_ends_cancelled() -> None:
    t = Table()
    ahead(t)
    run(t, c.Cancel(2))
    out = run(t, c.Ended(2, 1, Facts(None)))
    (done,) = [a.job for a in out.actions if isinstance(a, c.AttemptEnded)]
    assert done.state is JobState.CANCELLED and done.reason is FailureReason.CANCELLED


def test_a_hang_of_its_card_while_it_waits_queues_it_again_charged_to_nothing() -> None:
    t = Table()
    ahead(t)
    out = run(t, c.HangSeen(2, 0, HANG, {"gpu": 0}))
    assert out.actions == [c.Kill(2, None, NOW.wall)]  # no re-probe on its behalf
    assert t.live[2].kill is FailureReason.INTERRUPTED
    out = run(t, c.Ended(2, 1, Facts(None)))
    (ended,) = [a for a in out.actions if isinstance(a, c.AttemptEnded)]
    assert ended.job.state is JobState.QUEUED
    assert ended.attempt.reason == FailureReason.INTERRUPTED.value
    assert (ended.job.ordinary_used, ended.job.gpu_hang_used) == (0, 0)
    assert not [w for w in out.writes if isinstance(w, c.RecordHang)]


def test_a_hang_once_it_is_up_is_a_hang() -> None:
    t = Table()
    ahead(t)
    run(t, c.Ended(1, 1, Facts(ExitStatus(0, None))))
    run(t, c.Started(2, 1, 202, None))
    out = run(t, c.HangSeen(2, 0, HANG, {"gpu": 0}))
    assert out.actions == [c.Kill(2, 0, NOW.wall)] and t.live[2].kill is FailureReason.GPU_HANG
