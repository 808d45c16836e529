"""The engine's `update` step: a queued job's priority, time limit and cards change in
the engine's turn, the queue order follows at once, and a job that is not queued is left
alone with a reason."""

from __future__ import annotations

from supervisor.core import commands as c
from supervisor.core.admission import Hold, Start
from supervisor.core.draft import Step, Verdict
from supervisor.core.engine import step
from supervisor.core.jobs import JobSpec
from supervisor.core.table import Table

NOW = c.Now(1_700_000_000.0, 500.0)


def run(t: Table, cmd: c.Command) -> Step:
    out = step(t, cmd, NOW)
    t.apply(out.changes)
    return out


def spec(gpus: int = 1) -> JobSpec:
    return JobSpec(("train",), "/", {}, 1000, 1000, gpus=gpus)


def order(t: Table) -> list[int]:
    return [job_id for _, job_id in t.queue.keys(t.queue.ends({}, 0))]


def saved(out: Step) -> list[c.SaveSpec]:
    return [w for w in out.writes if isinstance(w, c.SaveSpec)]


def test_a_new_priority_moves_the_job_in_the_queue_at_once() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec(), spec())))
    assert order(t) == [1, 2, 3]
    out = run(t, c.UpdateJob(3, 1000, priority=5))
    assert out.verdicts == {3: Verdict(True, "updated")}
    assert order(t) == [3, 1, 2] and t.jobs[3].spec.priority == 5
    (write,) = saved(out)
    assert write.job.spec.priority == 5
    (event,) = [e for w in out.writes if isinstance(w, c.SaveJob) for e in w.events]
    assert (event.kind, event.data) == ("updated", {"priority": 5})
    assert event.message == "priority 0 -> 5 (by uid 1000)"
    run(t, c.UpdateJob(3, 1000, priority=-1))
    assert order(t) == [1, 2, 3]


def test_time_limit_and_cards_change_and_all_unpins() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(gpus=2),)))
    out = run(t, c.UpdateJob(1, 0, time_limit_s=3600.0, cards=(0, 2)))
    job = t.jobs[1]
    assert (job.spec.time_limit_s, job.spec.cards) == (3600.0, (0, 2))
    (event,) = [e for w in out.writes if isinstance(w, c.SaveJob) for e in w.events]
    assert event.message == "time limit none -> 3600s; cards any -> 0,2 (by uid 0)"
    assert event.data == {"time_limit_s": 3600.0, "cards": [0, 2]}
    run(t, c.UpdateJob(1, 0, cards=()))
    assert t.jobs[1].spec.cards is None


def test_fewer_cards_than_the_job_asks_for_are_refused() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(gpus=2),)))
    out = run(t, c.UpdateJob(1, 0, cards=(1,)))
    assert out.verdicts == {1: Verdict(False, "asks for 2 GPUs but may use only 1 (card 1)")}
    assert out.writes == [] and t.jobs[1].spec.cards is None


def test_the_same_values_change_nothing() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.UpdateJob(1, 0, priority=0))
    assert out.verdicts == {1: Verdict(True, "unchanged")} and out.writes == []


def test_a_running_job_is_not_updated() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Dispatch((Start(1, (0,), 0),), ()))
    out = run(t, c.UpdateJob(1, 0, priority=9))
    assert out.verdicts == {1: Verdict(False, "is running; only a queued job can be updated")}
    assert out.writes == [] and t.jobs[1].spec.priority == 0


def test_an_ended_job_gets_no_verdict() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Cancel(1))
    assert run(t, c.UpdateJob(1, 0, priority=9)).verdicts == {}


def test_an_updated_job_keeps_its_wait_and_is_not_announced_again() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec())))
    held = Hold(2, "gpus", "waiting for 1 free GPU, 0 free")
    run(t, c.Dispatch((), (held,), full=frozenset({"gpu"})))
    assert t.held_since[2] == NOW.mono and 2 in t.announced
    assert 2 in t.queue.settled_kind  # settled: read again only when a card frees
    later = c.Now(NOW.wall + 60, NOW.mono + 60)
    t.apply(step(t, c.UpdateJob(2, 0, priority=3), later).changes)
    assert t.held_since[2] == NOW.mono and 2 in t.announced
    assert 2 not in t.queue.settled_kind and order(t)[0] == 2
    out = step(t, c.Dispatch((), (held,)), later)
    assert not [w for w in out.writes if isinstance(w, c.SaveJob)]  # no second queue_wait


def test_a_job_waiting_for_its_parent_still_waits_after_an_update() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.SubmitJobs((JobSpec(("merge",), "/", {}, 1000, 1000, after=(1,)),)))
    run(t, c.UpdateJob(2, 1000, priority=2))
    assert t.jobs[2].waiting_for == "waiting for job 1" and t.pending[2] == {1}
