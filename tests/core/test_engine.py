"""The engine's step: commands in, changes, writes and actions out. Pure: no store, no
clock, no process; expected values are written out."""

from __future__ import annotations

import signal

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core import commands as c
from supervisor.core.admission import Hold, Start
from supervisor.core.draft import Step
from supervisor.core.engine import step
from supervisor.core.jobs import TRANSITIONS, ExitStatus, FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.core.records import Attempt, Event
from supervisor.core.table import Phase, Table

NOW = c.Now(1_700_000_000.0, 500.0)
ISO = "2023-11-14T22:13:20.000Z"
OK, TERM = ExitStatus(0, None), ExitStatus(None, signal.SIGTERM)


def spec(gpus: int = 1, after: tuple[int, ...] = (), name: str = "") -> JobSpec:
    return JobSpec(("train",), "/", {}, 1000, 1000, gpus=gpus, after=after, name=name)


def run(t: Table, cmd: c.Command) -> Step:
    out = step(t, cmd, NOW)
    t.apply(out.changes)
    return out


def kinds(out: Step) -> list[str]:
    return [type(x).__name__ for x in [*out.writes, *out.actions]]


def events(out: Step) -> list[str]:
    return [e.kind for w in out.writes if isinstance(w, c.SaveJob) for e in w.events]


def claimed(t: Table, *specs: JobSpec) -> list[int]:
    ids = [w.job.id for w in run(t, c.SubmitJobs(specs)).writes if isinstance(w, c.InsertJob)]
    pairs = enumerate(zip(ids, specs, strict=True))
    starts = tuple(Start(i, (k,) if s.gpus else (), 0) for k, (i, s) in pairs)
    run(t, c.Dispatch(starts, ()))
    return ids


def test_a_submit_takes_the_next_ids_and_queues() -> None:
    t = Table()
    t.next_id = 41
    out = run(t, c.SubmitJobs((spec(), spec(gpus=0))))
    assert [w.job.id for w in out.writes if isinstance(w, c.InsertJob)] == [41, 42]
    assert kinds(out) == ["InsertJob", "InsertJob", "Changed", "Changed"]
    assert t.next_id == 43 and t.jobs[41].state is JobState.QUEUED
    assert t.jobs[41].submitted_at == ISO and len(t.queue) == 2


def test_a_hold_is_shown_and_evented_once_per_wait() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    ram = Hold(1, "host_ram", "waiting for host RAM: needs ~60 GiB, ~30 GiB free")
    out = run(t, c.Dispatch((), (ram,)))
    assert events(out) == ["queue_wait"]
    assert (t.jobs[1].hold_reason, t.jobs[1].waiting_for) == (ram.reason, ram.message)
    assert t.held_since[1] == NOW.mono and t.held_counts() == {"host_ram": 1}
    gpus = Hold(1, "gpus", "waiting for 1 free GPU, 0 free")
    out = run(t, c.Dispatch((), (gpus,)))
    assert events(out) == [] and t.jobs[1].hold_reason == "gpus"  # shown, not evented again
    assert t.held_counts() == {"gpus": 1}


def test_a_claim_stores_the_attempt_before_anything_runs() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.Dispatch((Start(1, (1,), 4096),), ()))
    assert kinds(out) == ["SaveJob", "Changed", "Spawn"]
    (save,) = out.writes
    assert isinstance(save, c.SaveJob) and save.new_attempt == Attempt(1, 1, (1,), ISO, "")
    assert [e.message for e in save.events] == ["attempt 1 on GPUs 1"]
    assert t.jobs[1].state is JobState.RUNNING and t.jobs[1].gpus == (1,)
    live = t.live[1]
    assert (live.phase, live.seq, live.vram_reserved_mb) == (Phase.CLAIMED, 1, 4096)
    assert not t.queue and t.seq == 1


def test_a_cancel_of_a_queued_job_ends_it() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.Cancel(1))
    assert events(out) == ["cancelled"] and 1 not in t.jobs and not t.queue
    (changed,) = [a for a in out.actions if isinstance(a, c.Changed)]
    assert (changed.new.state, changed.new.reason) == (JobState.CANCELLED, FailureReason.CANCELLED)


def test_a_cancel_before_the_start_ends_the_job_and_nothing_is_spawned() -> None:
    t = Table()
    claimed(t, spec())
    out = run(t, c.Cancel(1))
    assert events(out) == ["exited", "cancelled"] and 1 not in t.jobs and 1 not in t.live
    (save,) = out.writes
    assert isinstance(save, c.SaveJob) and save.ended_attempt is not None
    assert (save.job.state, save.ended_attempt.reason) == (JobState.CANCELLED, "cancelled")
    assert not any(isinstance(a, c.Kill | c.Spawn) for a in out.actions)
    assert run(t, c.Spawning(1, 1)).changes.live == {}  # the runner finds nothing to start


def test_a_cancel_during_the_start_stops_the_attempt_once_it_has_a_process() -> None:
    t = Table()
    claimed(t, spec())
    run(t, c.Spawning(1, 1))
    out = run(t, c.Cancel(1))
    stop = c.RecordStop(1, 1, "cancelled", NOW.iso)  # the intent, committed first
    assert out.writes == [stop] and out.actions == []  # no process to kill yet
    assert t.jobs[1].state is JobState.RUNNING and t.live[1].kill is FailureReason.CANCELLED
    out = run(t, c.Started(1, 1, 4242, 1.5))
    assert kinds(out) == ["SetPid", "ProcessStarted", "Kill"]
    out = run(t, c.Ended(1, 1, Facts(TERM)))
    assert events(out) == ["exited", "cancelled"] and 1 not in t.jobs


def test_a_cancel_of_a_running_job_kills_it_and_it_ends_cancelled() -> None:
    t = Table()
    claimed(t, spec())
    run(t, c.Spawning(1, 1))
    run(t, c.Started(1, 1, 4242, 1.5))
    assert t.live[1].attempt.pid == 4242 and t.live[1].phase is Phase.RUNNING
    assert kinds(run(t, c.Cancel(1))) == ["RecordStop", "Kill"]
    assert kinds(run(t, c.Cancel(1))) == []  # already being stopped
    out = run(t, c.Ended(1, 1, Facts(OK)))  # it exited 0 as the signal came: cancelled all the same
    assert [a.new.state for a in out.actions if isinstance(a, c.Changed)] == [JobState.CANCELLED]


def test_a_drain_requeues_claimed_and_running_jobs_uncharged() -> None:
    t = Table()
    claimed(t, spec(), spec())
    run(t, c.Spawning(2, 1))
    run(t, c.Started(2, 1, 99, None))
    out = run(t, c.Stop(1, FailureReason.INTERRUPTED))
    assert events(out) == ["exited", "interrupted"] and t.jobs[1].state is JobState.QUEUED
    assert kinds(run(t, c.Stop(2, FailureReason.INTERRUPTED))) == ["RecordStop", "Kill"]
    run(t, c.Ended(2, 1, Facts(TERM)))
    assert t.jobs[2].state is JobState.QUEUED and t.jobs[2].ordinary_used == 0


def test_a_hang_kills_with_a_reprobe_and_records_the_machine_of_that_moment() -> None:
    t = Table()
    claimed(t, spec(name="render"))
    run(t, c.Spawning(1, 1))
    run(t, c.Started(1, 1, 7, None))
    run(t, c.SubmitJobs((spec(),)))  # another job: the table moves on meanwhile
    run(t, c.Progress(1, "frame 17"))
    machine = {"gpu": 0, "at": "2023-11-14T22:13:19.000Z", "host_mem_available_mb": 900}
    out = run(t, c.HangSeen(1, 0, {"source": "kernel_log"}, machine))
    assert out.actions == [c.Kill(1, 0, NOW.wall)]
    out = run(t, c.Ended(1, 1, Facts(TERM)))
    (record,) = [w for w in out.writes if isinstance(w, c.RecordHang)]
    assert record.row["at"] == "2023-11-14T22:13:19.000Z"  # when seen, not when it ended
    assert record.row["host_mem_available_mb"] == 900
    assert (record.row["name"], record.row["frame"]) == ("render", "frame 17")
    assert t.jobs[1].state is JobState.QUEUED and t.jobs[1].gpu_hang_used == 1


def test_a_hang_does_not_turn_a_cancel_into_a_retry() -> None:
    t = Table()
    claimed(t, spec())
    run(t, c.Spawning(1, 1))
    run(t, c.Started(1, 1, 7, None))
    run(t, c.Cancel(1))
    run(t, c.HangSeen(1, 0, {"source": "kernel_log"}))
    run(t, c.Ended(1, 1, Facts(TERM)))
    assert 1 not in t.jobs


def test_a_late_reset_line_reclassifies_a_queued_retry() -> None:
    t = Table()
    claimed(t, spec())
    run(t, c.Spawning(1, 1))
    run(t, c.Started(1, 1, 7, None))
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(1, None))))
    (ended,) = [a for a in out.actions if isinstance(a, c.AttemptEnded)]
    assert t.jobs[1].ordinary_used == 1
    out = run(t, c.Reclassify(1, ended.attempt, {"source": "kernel_log"}, {"at": ISO}))
    assert kinds(out) == ["SaveJob", "RecordHang", "Changed", "AttemptEnded"]
    assert (t.jobs[1].ordinary_used, t.jobs[1].gpu_hang_used) == (0, 1)
    assert kinds(run(t, c.Reclassify(1, ended.attempt, {}, {}))) == []  # once


def test_dependencies_wait_then_start_or_fail_down_the_line() -> None:
    t = Table()
    claimed(t, spec())  # job 1 runs
    run(t, c.SubmitJobs((spec(after=(1,)),)))  # 2 waits for 1
    run(t, c.SubmitJobs((spec(after=(2,)),)))  # 3 waits for 2
    assert t.pending == {2: frozenset({1}), 3: frozenset({2})}
    assert t.jobs[2].waiting_for == "waiting for job 1"
    run(t, c.Spawning(1, 1))
    run(t, c.Started(1, 1, 7, None))
    run(t, c.Ended(1, 1, Facts(OK)))
    assert 2 not in t.pending and t.jobs[2].waiting_for is None
    out = run(t, c.Cancel(2))
    assert events(out) == ["cancelled", "dependency_failed"]
    assert 3 not in t.jobs and not t.pending


def test_a_parent_that_ended_badly_before_the_submit_fails_the_child_at_once() -> None:
    t = Table()
    out = run(t, c.SubmitJobs((spec(after=(7,)),), {7: JobState.FAILED}))
    assert kinds(out) == ["InsertJob", "SaveJob", "Changed", "Changed"]
    assert events(out) == ["dependency_failed"] and not t.jobs
    run(t, c.SubmitJobs((spec(after=(7,)),), {7: JobState.SUCCEEDED}))
    assert 2 not in t.pending and t.jobs[2].state is JobState.QUEUED


def test_recover_requeues_what_ran_and_remembers_announced_holds() -> None:
    t = Table()
    running = Job(3, spec(), JobState.RUNNING, attempts=1, started_at=ISO)
    held = Job(4, spec(), hold_reason="host_ram", waiting_for="waiting for host RAM")
    attempt = Attempt(3, 1, (0,), ISO, "", pid=55)
    out = run(t, c.Recover((running, held), {3: attempt}, frozenset({3}), {}, 10))
    (save,) = out.writes
    assert isinstance(save, c.SaveJob) and save.ended_attempt is not None
    assert save.ended_attempt.reason == "interrupted"
    assert [e.message for e in save.events] == [
        "the daemon stopped while this attempt ran; its leftover processes were killed"
    ]
    assert t.jobs[3].state is JobState.QUEUED and t.jobs[3].reason is FailureReason.INTERRUPTED
    assert t.announced == {4} and t.next_id == 10 and len(t.queue) == 2


def test_recover_keeps_an_adopted_attempt_running_with_the_pid_its_keeper_recorded() -> None:
    t = Table()
    started = Job(3, spec(), JobState.RUNNING, attempts=1, started_at=ISO)
    known = Job(5, spec(), JobState.RUNNING, attempts=2, started_at=ISO)
    unrecorded = Attempt(3, 1, (1,), ISO, "")  # the daemon died before it committed the pid
    recorded = Attempt(5, 2, (0,), ISO, "", pid=77, pid_start=1234.5)
    adopted: dict[int, tuple[int, float | None]] = {3: (66, 999.0), 5: (77, 1234.5)}
    out = run(
        t,
        c.Recover((started, known), {3: unrecorded, 5: recorded}, frozenset(), {}, 9, adopted),
    )
    (set_pid,) = out.writes
    assert isinstance(set_pid, c.SetPid)
    assert (set_pid.attempt.job_id, set_pid.attempt.n) == (3, 1)
    assert (set_pid.attempt.pid, set_pid.attempt.pid_start) == (66, 999.0)
    assert t.live[3].attempt.pid == 66 and t.live[3].cards == (1,)
    assert t.live[5].attempt.pid == 77 and t.live[5].cards == (0,)
    assert t.live[3].phase is Phase.RUNNING and t.live[5].phase is Phase.RUNNING
    assert t.jobs[3].state is JobState.RUNNING and t.jobs[5].attempts == 2
    assert not t.queue


# ---- any sequence of commands -----------------------------------------------------------

commands = st.lists(
    st.tuples(
        st.sampled_from(["submit", "dispatch", "spawning", "started", "end", "cancel", "stop"]),
        st.integers(1, 6),
        st.sampled_from([0, 1, 137]),
    ),
    max_size=60,
)


def _command(t: Table, op: str, job_id: int, code: int) -> c.Command:
    n = t.live[job_id].attempt.n if job_id in t.live else 1
    if op == "submit":
        return c.SubmitJobs((spec(gpus=code % 2),))
    if op == "dispatch":
        return c.Dispatch((Start(job_id, (), 0),), ())
    if op == "spawning":
        return c.Spawning(job_id, n)
    if op == "started":
        return c.Started(job_id, n, 100 + job_id, None)
    if op == "end":
        status = ExitStatus(code, None) if code != 137 else ExitStatus(None, signal.SIGKILL)
        return c.Ended(job_id, n, Facts(status))
    if op == "cancel":
        return c.Cancel(job_id)
    return c.Stop(job_id, FailureReason.INTERRUPTED)


@settings(max_examples=300, deadline=None)
@given(commands)
def test_any_sequence_keeps_the_table_and_the_rules(script: list[tuple[str, int, int]]) -> None:
    t = Table()
    cancelled_before_start: set[int] = set()
    for op, job_id, code in script:
        cmd = _command(t, op, job_id, code)
        existed = job_id in t.jobs
        was_running = job_id in t.live and t.live[job_id].phase is not Phase.CLAIMED
        out = run(t, cmd)
        for a in out.actions:
            if isinstance(a, c.Changed) and a.old is not None and a.old.state != a.new.state:
                assert a.new.state in TRANSITIONS[a.old.state]
            if isinstance(a, c.Spawn):
                assert a.job.id not in cancelled_before_start
        if isinstance(cmd, c.Cancel) and existed and not was_running and job_id not in t.jobs:
            cancelled_before_start.add(job_id)  # "cancelled": nothing of it may run
        started = [w for w in out.writes if isinstance(w, c.SetPid)]
        assert all(w.attempt.job_id not in cancelled_before_start for w in started)
        assert [a for a in out.actions if isinstance(a, c.ProcessStarted)] == [
            c.ProcessStarted(w.attempt.job_id, w.attempt.pid or 0) for w in started
        ]
        _invariants(t)


def _invariants(t: Table) -> None:
    for job_id, job in t.jobs.items():
        assert job.state in (JobState.QUEUED, JobState.RUNNING)
        assert (job_id in t.live) == (job.state is JobState.RUNNING)
    assert set(t.live) <= set(t.jobs)
    queued = {j for j, job in t.jobs.items() if job.state is JobState.QUEUED}
    assert len(t.queue) == len(queued)
    assert set(t.held_since) <= queued and t.announced <= queued


def test_a_submits_notes_are_recorded_with_its_jobs() -> None:
    note = Event("mem_over_limit", "needs more than the host has")
    out = run(Table(), c.SubmitJobs((spec(), spec()), notes=((), (note,))))
    inserts = [w for w in out.writes if isinstance(w, c.InsertJob)]
    assert [w.notes for w in inserts] == [(), (note,)]
