"""What a job waits for: `--after` parents must succeed, `--after-any` parents only end,
and a parent of an array stands for every index of it. Pure: the engine's step on a
table, expected values written out."""

from __future__ import annotations

import signal

from supervisor.core import commands as c
from supervisor.core.admission import Start
from supervisor.core.dependencies import (
    blocks,
    expand,
    expanded,
    newest_per_index,
    parents,
    waiting_text,
)
from supervisor.core.draft import Step
from supervisor.core.engine import step
from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.core.table import Table

NOW = c.Now(1_700_000_000.0, 500.0)
OK, FAIL, TERM = ExitStatus(0, None), ExitStatus(1, None), ExitStatus(None, signal.SIGTERM)


def spec(after: tuple[int, ...] = (), after_any: tuple[int, ...] = ()) -> JobSpec:
    return JobSpec(("x",), "/", {}, 1000, 1000, gpus=0, retries=0, after=after, after_any=after_any)


def run(t: Table, cmd: c.Command) -> Step:
    out = step(t, cmd, NOW)
    t.apply(out.changes)
    return out


def events(out: Step) -> list[str]:
    return [e.kind for w in out.writes if isinstance(w, c.SaveJob) for e in w.events]


def finish(t: Table, job_id: int, status: ExitStatus) -> Step:
    """Start the queued job and end its attempt with `status`."""
    run(t, c.Dispatch((Start(job_id, (), 0),), ()))
    run(t, c.Spawning(job_id, 1))
    run(t, c.Started(job_id, 1, 100 + job_id, None))
    return run(t, c.Ended(job_id, 1, Facts(status)))


def array_of(t: Table, n: int) -> tuple[int, ...]:
    """Submit an array of n indices; its jobs' ids (the first names the array)."""
    specs = tuple(
        JobSpec(("x",), "/", {}, 1000, 1000, gpus=0, retries=0, array_index=i) for i in range(n)
    )
    out = run(t, c.SubmitJobs(specs))
    return tuple(w.job.id for w in out.writes if isinstance(w, c.InsertJob))


# ---- the pure pieces ------------------------------------------------------------------


def test_parents_are_both_kinds_each_once() -> None:
    assert parents(spec((1, 2), (2, 3))) == (1, 2, 3)
    assert parents(spec()) == ()


def test_an_after_parent_blocks_unless_it_succeeded_an_after_any_one_never() -> None:
    s = spec((1,), (2,))
    assert blocks(s, 1, JobState.FAILED) and blocks(s, 1, JobState.CANCELLED)
    assert not blocks(s, 1, JobState.SUCCEEDED)
    assert not blocks(s, 2, JobState.FAILED) and not blocks(s, 2, JobState.CANCELLED)
    assert not blocks(spec((1,), (1,)), 1, JobState.SUCCEEDED)
    assert blocks(spec((1,), (1,)), 1, JobState.FAILED)  # named by both: the stricter


def test_newest_per_index_takes_a_restart_over_the_run_it_replaced() -> None:
    assert newest_per_index([(3, 1), (1, 0), (2, 2), (9, 1)]) == (1, 9, 2)
    assert newest_per_index([]) == ()


def test_expand_spells_out_arrays_once_each_in_order() -> None:
    arrays = {5: (4, 5, 6), 4: (4, 5, 6), 6: (4, 5, 6)}
    assert expand((1, 5, 2, 4), arrays) == (1, 4, 5, 6, 2)
    s = expanded(spec((5,), (6, 9)), arrays)
    assert s.after == (4, 5, 6) and s.after_any == (9,)  # the stricter wins
    plain = spec((1,))
    assert expanded(plain, arrays) is plain and expanded(plain, {}) is plain


def test_the_waiting_text_names_a_few_parents_and_counts_the_rest() -> None:
    assert waiting_text(frozenset()) is None
    assert waiting_text(frozenset({7, 4})) == "waiting for job 4, 7"
    assert waiting_text(frozenset({1, 2, 3, 4, 5})) == "waiting for job 1, 2, 3, 4, 5"
    many = frozenset(range(190, 1002))
    assert waiting_text(many) == "waiting for 812 jobs: 190, 191, 192, ..."


# ---- through the engine ---------------------------------------------------------------


def test_after_an_array_waits_for_every_index_whichever_was_named() -> None:
    for named in (1, 3):  # the array's id, or any index of it
        t = Table()
        ids = array_of(t, 4)
        arrays = {i: ids for i in ids}
        run(t, c.SubmitJobs((spec(after=(named,)),), arrays=arrays))
        child = ids[-1] + 1
        assert t.jobs[child].spec.after == ids and t.pending[child] == set(ids)
        for i in ids[:3]:
            finish(t, i, OK)
        assert t.jobs[child].waiting_for == f"waiting for job {ids[3]}"
        finish(t, ids[3], OK)
        assert child not in t.pending and t.jobs[child].waiting_for is None


def test_a_failed_index_fails_the_child_of_the_array() -> None:
    t = Table()
    ids = array_of(t, 3)
    run(t, c.SubmitJobs((spec(after=(ids[0],)),), arrays={ids[0]: ids}))
    finish(t, ids[0], OK)
    out = finish(t, ids[1], FAIL)
    assert "dependency_failed" in events(out)
    child = t.jobs.get(ids[-1] + 1)
    assert child is None  # ended: failed, left the table


def test_an_index_that_ended_badly_before_the_submit_fails_the_child_at_once() -> None:
    t = Table()
    out = run(
        t,
        c.SubmitJobs(
            (spec(after=(7,)),),
            {7: JobState.SUCCEEDED, 8: JobState.CANCELLED},
            arrays={7: (7, 8)},
        ),
    )
    assert events(out) == ["dependency_failed"] and not t.jobs


def test_after_any_starts_the_child_whatever_its_parents_ends() -> None:
    t = Table()
    ids = array_of(t, 2)
    run(t, c.SubmitJobs((spec(after_any=(ids[1],)),), arrays={ids[1]: ids}))
    child = ids[-1] + 1
    assert t.jobs[child].spec.after_any == ids
    finish(t, ids[0], FAIL)
    assert t.jobs[child].state is JobState.QUEUED and t.pending[child] == {ids[1]}
    run(t, c.Cancel(ids[1]))
    assert t.jobs[child].state is JobState.QUEUED and child not in t.pending


def test_after_any_of_an_ended_parent_does_not_wait_and_does_not_fail() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(after_any=(7,)),), {7: JobState.FAILED}))
    assert t.jobs[1].state is JobState.QUEUED and 1 not in t.pending


def test_both_kinds_on_one_job() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec())))
    run(t, c.SubmitJobs((spec(after=(1,), after_any=(2,)),)))
    finish(t, 2, TERM)  # killed: the after-any parent's end is enough
    assert t.pending[3] == {1}
    finish(t, 1, OK)
    assert 3 not in t.pending and t.jobs[3].state is JobState.QUEUED


def test_recover_waits_again_for_after_any_parents() -> None:
    t = Table()
    waiting = Job(3, spec(after=(1,), after_any=(2,)))
    parent = Job(1, spec())
    out = run(t, c.Recover((parent, waiting), {}, frozenset(), {2: JobState.FAILED}, 10))
    assert t.pending[3] == {1} and "dependency_failed" not in events(out)
    out = finish(t, 1, FAIL)
    (failed,) = [a.new for a in out.actions if isinstance(a, c.Changed) and a.new.id == 3]
    assert failed.state is JobState.FAILED and failed.reason is FailureReason.DEPENDENCY_FAILED
