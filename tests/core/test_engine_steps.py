"""The engine's step, command by command: every write and action it returns, and the
table after it, written out in full."""

from __future__ import annotations

import signal
from dataclasses import replace

from supervisor.core import commands as c
from supervisor.core.admission import Hold, Start
from supervisor.core.draft import Step
from supervisor.core.engine import step
from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt, Event
from supervisor.core.table import Live, Phase, Table
from supervisor.daemon.clock import epoch_from_iso, iso_from_epoch

NOW = c.Now(1_700_000_000.0, 500.0)
ISO = "2023-11-14T22:13:20.000Z"  # NOW.wall
SEEN = "2023-11-14T22:13:19.000Z"
TERM = ExitStatus(None, signal.SIGTERM)
HANG = {"source": "kernel_log", "lines": ["NVRM: Xid 79"]}
R = FailureReason


def spec(gpus: int = 1, after: tuple[int, ...] = (), **more: object) -> JobSpec:
    return JobSpec(("train",), "/", {}, 1000, 1000, gpus=gpus, after=after, **more)  # type: ignore[arg-type]


def run(t: Table, cmd: c.Command) -> Step:
    out = step(t, cmd, NOW)
    t.apply(out.changes)
    return out


def queued(job_id: int, s: JobSpec | None = None, **more: object) -> Job:
    return Job(job_id, s or spec(), submitted_at=ISO, **more)  # type: ignore[arg-type]


def running(t: Table, *specs: JobSpec) -> None:
    """Submit the specs and take each through claim, spawn and start (pid 100 + id)."""
    first = t.next_id
    run(t, c.SubmitJobs(specs))
    ids = range(first, first + len(specs))
    run(t, c.Dispatch(tuple(Start(i, (k,), 0) for k, i in enumerate(ids)), ()))
    for i in ids:
        run(t, c.Spawning(i, 1))
        run(t, c.Started(i, 1, 100 + i, None))


# ---- submit and dispatch -------------------------------------------------------------------


def test_a_submit_writes_and_announces_each_job() -> None:
    t = Table()
    out = run(t, c.SubmitJobs((spec(), spec(gpus=0))))
    jobs = (queued(1), queued(2, spec(gpus=0)))
    assert out.writes == [c.InsertJob(jobs[0]), c.InsertJob(jobs[1])]
    assert out.actions == [c.Changed(None, jobs[0]), c.Changed(None, jobs[1])]


def test_a_claim_stores_the_attempt_and_spawns_it_in_dispatch_order() -> None:
    t = Table()
    t.seq = 5
    run(t, c.SubmitJobs((spec(gpus=2, mem_key="m", mem_scale=2.0), spec(gpus=0))))
    plan = Projection(3000, "declared", 0)
    cmd = c.Dispatch(
        (Start(1, (0, 2), 4096), Start(2, (), 0)),
        (),
        projections={1: plan},
        uuids={1: ("GPU-a", "GPU-c")},
    )
    out = run(t, cmd)
    a1 = Attempt(1, 1, (0, 2), ISO, "m", mem_scale=2.0, gpu_uuids=("GPU-a", "GPU-c"))
    a2 = Attempt(2, 1, (), ISO, "")
    was1, was2 = queued(1, spec(gpus=2, mem_key="m", mem_scale=2.0)), queued(2, spec(gpus=0))
    j1 = replace(was1, state=JobState.RUNNING, started_at=ISO, gpus=(0, 2), attempts=1)
    j2 = replace(was2, state=JobState.RUNNING, started_at=ISO, attempts=1)
    assert out.writes == [
        c.SaveJob(j1, ISO, (Event("started", "attempt 1 on GPUs 0,2", {"gpus": [0, 2]}),), a1),
        c.SaveJob(j2, ISO, (Event("started", "attempt 1 on GPUs none", {"gpus": []}),), a2),
    ]
    assert out.actions == [
        c.Changed(was1, j1),
        c.Spawn(j1, a1, (0, 2), 6),
        c.Changed(was2, j2),
        c.Spawn(j2, a2, (), 7),
    ]
    assert t.live == {
        1: Live(a1, (0, 2), 6, Phase.CLAIMED, plan, 4096, 500.0),
        2: Live(a2, (), 7, Phase.CLAIMED, None, 0, 500.0),
    }
    assert t.seq == 7


def test_a_claim_skips_a_job_that_waits_for_its_parents_or_is_gone() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec(after=(1,)))))
    out = run(t, c.Dispatch((Start(2, (1,), 0), Start(9, (0,), 0)), ()))
    assert (out.writes, out.actions, t.live, t.seq) == ([], [], {}, 0)


def test_a_hold_writes_its_queue_wait_once_with_its_reason() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    hold = Hold(1, "host_ram", "waiting for host RAM: needs ~60 GiB, ~30 GiB free")
    out = run(t, c.Dispatch((), (hold,)))
    held = queued(1, hold_reason="host_ram", waiting_for=hold.message)
    event = Event("queue_wait", hold.message, {"reason": "host_ram"})
    assert out.writes == [c.SaveJob(held, ISO, (event,))]
    assert out.actions == [] and t.jobs[1] == held


def test_a_hold_left_unannounced_is_shown_and_settled_and_written_by_a_later_dispatch() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec())))
    hold = Hold(2, "gpus", "waiting for 1 free GPU, 0 free")
    out = run(t, c.Dispatch((Start(1, (0,), 0),), (hold,), full=frozenset({"gpu"}), announce=False))
    held = queued(2, hold_reason="gpus", waiting_for=hold.message)
    assert [w.job.id for w in out.writes if isinstance(w, c.SaveJob)] == [1]  # the claim's
    assert t.jobs[2] == held and t.held_since == {2: NOW.mono}
    assert 2 not in t.announced and t.queue.settled["gpu"] == [(0, 2)]
    later = run(t, c.Dispatch((), (hold,)))
    event = Event("queue_wait", hold.message, {"reason": "gpus"})
    assert later.writes == [c.SaveJob(held, ISO, (event,))]
    assert 2 in t.announced and t.queue.settled["gpu"] == [(0, 2)]
    assert run(t, c.Dispatch((), (hold,))).writes == []  # once a wait


def test_holds_and_settling_leave_jobs_that_are_not_queued_alone() -> None:
    t = Table()
    running(t, spec())
    before = t.jobs[1]
    holds = (Hold(1, "gpus", "waiting for 1 free GPU, 0 free"), Hold(9, "gpus", "gone"))
    out = run(t, c.Dispatch((), holds, full=frozenset({"gpu"})))
    assert (out.writes, out.actions, out.changes.settle) == ([], [], [])
    assert t.jobs[1] == before and t.held_since == {}


# ---- a process: spawning, started, ended ----------------------------------------------------


def test_a_started_process_is_recorded_and_killed_if_stopped_meanwhile() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(), spec())))
    run(t, c.Dispatch((Start(1, (0,), 0), Start(2, (1,), 0)), ()))
    run(t, c.Spawning(1, 1))
    run(t, c.Spawning(2, 1))
    assert (t.live[1].phase, t.live[2].phase) == (Phase.SPAWNING, Phase.SPAWNING)
    out = run(t, c.Started(1, 1, 4242, 1.5))
    pid = Attempt(1, 1, (0,), ISO, "", pid=4242, pid_start=1.5)
    assert (out.writes, out.actions) == ([c.SetPid(pid)], [c.ProcessStarted(1, 4242)])
    assert t.live[1].phase is Phase.RUNNING and t.live[1].attempt == pid
    run(t, c.Cancel(2))
    out = run(t, c.Started(2, 1, 4343, None))
    assert out.actions == [c.ProcessStarted(2, 4343), c.Kill(2, None, NOW.wall)]


def test_an_end_closes_the_attempt_and_tells_the_cards() -> None:
    t = Table()
    running(t, spec())
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(0, None), peak_rss_mb=300)))
    closed = Attempt(1, 1, (0,), ISO, "", pid=101, ended_at=ISO, exit_code=0, peak_rss_mb=300)
    started = replace(queued(1), state=JobState.RUNNING, started_at=ISO, gpus=(0,), attempts=1)
    done = replace(started, state=JobState.SUCCEEDED, ended_at=ISO, exit_code=0)
    event = Event("exited", "exited 0", {"exit_code": 0})
    assert out.writes == [c.SaveJob(done, ISO, (event,), None, closed)]
    assert out.actions == [c.Changed(started, done), c.AttemptEnded(done, closed, (0,))]


def hang_row(out: Step) -> dict[str, object]:
    (record,) = [w for w in out.writes if isinstance(w, c.RecordHang)]
    return record.row


def test_a_hang_found_at_the_end_keeps_the_readings_taken_with_it() -> None:
    t = Table()
    running(t, spec())
    readings = {"gpu": 0, "at": SEEN, "host_mem_available_mb": 700}
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(1, None), hang=HANG, machine=readings)))
    assert hang_row(out) == {
        **readings,
        "job": 1,
        "attempt": 1,
        "evidence": HANG,
        "labels": {},
        "name": None,
        "frame": None,
    }


def test_a_hang_found_at_the_end_without_readings_is_stamped_now() -> None:
    t = Table()
    running(t, spec())
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(1, None), hang=HANG)))
    assert hang_row(out) == {
        "at": ISO,
        "job": 1,
        "attempt": 1,
        "gpu": 0,
        "evidence": HANG,
        "labels": {},
        "name": None,
        "frame": None,
    }


def test_the_readings_of_the_hang_seen_first_stand_over_those_at_the_end() -> None:
    t = Table()
    running(t, spec())
    run(t, c.HangSeen(1, 0, HANG, {"gpu": 0, "host_mem_available_mb": 900}))
    later = {"gpu": 0, "at": SEEN, "host_mem_available_mb": 5}
    out = run(t, c.Ended(1, 1, Facts(TERM, hang=HANG, machine=later)))
    row = hang_row(out)
    assert (row["host_mem_available_mb"], row["at"]) == (900, ISO)


def test_readings_at_an_end_without_hang_evidence_are_not_the_hang_s() -> None:
    t = Table()
    running(t, spec())
    run(t, c.HangSeen(1, 0, HANG))
    out = run(t, c.Ended(1, 1, Facts(TERM, machine={"host_mem_available_mb": 5})))
    assert hang_row(out) == {
        "job": 1,
        "attempt": 1,
        "gpu": 0,
        "at": ISO,
        "evidence": HANG,
        "labels": {},
        "name": None,
        "frame": None,
    }


# ---- stops and cancels ----------------------------------------------------------------------


def test_a_stop_kills_with_the_card_to_probe_again() -> None:
    t = Table()
    running(t, spec())
    out = run(t, c.Stop(1, R.OOM_KILLED, {"source": "squeeze_guard"}, 3))
    assert out.actions == [c.Kill(1, 3, NOW.wall)]
    assert out.writes == [c.RecordStop(1, 1, "oom_killed", NOW.iso, {"source": "squeeze_guard"})]


def test_a_hang_replaces_the_reason_of_a_stop_under_way() -> None:
    t = Table()
    running(t, spec())
    run(t, c.Stop(1, R.TIMEOUT, {"limit_s": 2.0}))
    run(t, c.HangSeen(1, 0, HANG))
    out = run(t, c.Ended(1, 1, Facts(TERM)))
    (ended,) = [a for a in out.actions if isinstance(a, c.AttemptEnded)]
    assert (ended.attempt.reason, ended.attempt.evidence) == ("gpu_hang", HANG)
    assert t.jobs[1].state is JobState.QUEUED


def test_the_first_reason_of_a_stop_stands_over_a_drain() -> None:
    t = Table()
    running(t, spec())
    run(t, c.Stop(1, R.TIMEOUT, {"limit_s": 2.0}))
    run(t, c.Stop(1, R.INTERRUPTED))
    out = run(t, c.Ended(1, 1, Facts(TERM)))
    (ended,) = [a for a in out.actions if isinstance(a, c.AttemptEnded)]
    assert (ended.attempt.reason, ended.attempt.evidence) == ("timeout", {"limit_s": 2.0})
    assert ended.job.state is JobState.FAILED


def test_a_stop_before_the_process_ends_the_attempt_with_its_evidence() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Dispatch((Start(1, (0,), 0),), ()))
    out = run(t, c.Stop(1, R.TIMEOUT, {"limit_s": 2.0}))
    (save,) = out.writes
    assert isinstance(save, c.SaveJob) and save.ended_attempt is not None
    assert save.ended_attempt.evidence == {"limit_s": 2.0}
    assert [e.message for e in save.events] == ["timeout: past its wall-time limit of 2s"]


def test_a_cancel_of_a_queued_job_is_stamped_and_said() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    out = run(t, c.Cancel(1))
    gone = replace(
        queued(1), state=JobState.CANCELLED, reason=R.CANCELLED, ended_at=ISO, waiting_for=None
    )
    assert out.writes == [c.SaveJob(gone, ISO, (Event("cancelled", "cancelled while queued"),))]
    assert out.actions == [c.Changed(queued(1), gone)]


# ---- a late reset line, progress, hold -------------------------------------------------------


def test_a_reclassified_attempt_is_saved_recorded_and_its_cards_told() -> None:
    t = Table()
    running(t, spec(name="render"))
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(1, None))))
    (ended,) = [a for a in out.actions if isinstance(a, c.AttemptEnded)]
    evidence = {"source": "kernel_log", "late": True}
    out = run(t, c.Reclassify(1, ended.attempt, evidence, {"host_mem_available_mb": 800}))
    job = replace(ended.job, reason=R.GPU_HANG, ordinary_used=0, gpu_hang_used=1)
    attempt = replace(ended.attempt, reason="gpu_hang", evidence=evidence)
    message = "attempt 1 reclassified as gpu_hang: a reset line for its GPU followed"
    row = {
        "host_mem_available_mb": 800,
        "job": 1,
        "attempt": 1,
        "gpu": 0,
        "at": ISO,
        "evidence": evidence,
        "labels": {},
        "name": "render",
        "frame": None,
    }
    assert out.writes == [
        c.SaveJob(job, ISO, (Event("gpu_hang", message),), None, attempt),
        c.RecordHang(row),
    ]
    assert out.actions == [c.Changed(ended.job, job), c.AttemptEnded(job, attempt, (0,))]


def test_commands_for_a_job_that_is_not_there_change_nothing() -> None:
    t = Table()
    attempt = Attempt(9, 1, (0,), ISO, "", reason="exit_nonzero")
    for cmd in (c.Reclassify(9, attempt, HANG), c.Progress(9, "frame 1"), c.Cancel(9)):
        out = run(t, cmd)
        assert (out.writes, out.actions, out.changes.jobs) == ([], [], {})


def test_a_hold_clears_the_reason_shown_and_says_who() -> None:
    t = Table()
    run(t, c.SubmitJobs((spec(),)))
    run(t, c.Dispatch((), (Hold(1, "gpus", "waiting for 1 free GPU, 0 free"),)))
    out = run(t, c.HoldJob(1, True, 1000))
    held = queued(1, held=True, waiting_for="held (gpusv release 1)")
    assert out.writes == [c.SaveJob(held, ISO, (Event("held", "held by uid 1000"),))]
    assert t.jobs[1] == held


# ---- dependencies -------------------------------------------------------------------------


def test_a_parent_s_success_leaves_its_children_waiting_for_the_others() -> None:
    t = Table()
    running(t, spec(), spec())
    run(t, c.SubmitJobs((spec(after=(1, 2)), spec(after=(1,)), spec(after=(1,)))))
    assert t.jobs[3].waiting_for == "waiting for job 1, 2"
    run(t, c.Cancel(4))  # a child gone before its parent ends
    run(t, c.Ended(1, 1, Facts(ExitStatus(0, None))))
    assert t.pending == {3: frozenset({2})}
    assert (t.jobs[3].waiting_for, t.jobs[5].waiting_for) == ("waiting for job 2", None)


def test_a_held_child_released_waits_for_its_parents_again() -> None:
    t = Table()
    running(t, spec(), spec())
    run(t, c.SubmitJobs((spec(after=(1, 2)),)))
    run(t, c.HoldJob(3, True, 0))
    run(t, c.HoldJob(3, False, 0))
    assert t.jobs[3].waiting_for == "waiting for job 1, 2"


def test_a_child_of_a_failed_parent_fails_saying_which() -> None:
    t = Table()
    running(t, spec())
    run(t, c.SubmitJobs((spec(after=(1,)),)))
    out = run(t, c.Ended(1, 1, Facts(ExitStatus(1, None), killed_for=R.CANCELLED)))
    child = queued(2, spec(after=(1,)), waiting_for="waiting for job 1")
    failed = replace(
        child,
        state=JobState.FAILED,
        reason=R.DEPENDENCY_FAILED,
        ended_at=ISO,
        waiting_for=None,
    )
    event = Event("dependency_failed", "dependency 1 did not succeed")
    assert c.SaveJob(failed, ISO, (event,)) in out.writes
    assert c.Changed(child, failed) in out.actions


def test_a_parent_that_failed_before_the_submit_is_named() -> None:
    t = Table()
    out = run(t, c.SubmitJobs((spec(after=(7,)),), {7: JobState.FAILED}))
    saves = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert [e.message for w in saves for e in w.events] == ["dependency 7 did not succeed"]


# ---- start-up -------------------------------------------------------------------------------


def test_recover_adopts_what_a_keeper_still_holds_in_dispatch_order() -> None:
    t = Table()
    t.seq = 3
    jobs = tuple(
        Job(i, spec(), JobState.RUNNING, attempts=1, started_at=ISO, gpus=(i - 1,)) for i in (1, 2)
    )
    attempts = {i: Attempt(i, 1, (i - 1,), ISO, "", pid=50 + i) for i in (1, 2)}
    plan = Projection(1000, "observed", 2)
    cmd = c.Recover(
        jobs,
        attempts,
        frozenset(),
        {},
        3,
        adopted={1: (51, None), 2: (52, None)},
        projections={1: plan},
        vram_reserved={1: 2048},
    )
    out = run(t, cmd)
    assert out.writes == []
    assert out.actions == [c.Changed(None, jobs[0]), c.Changed(None, jobs[1])]
    assert t.live == {
        1: Live(attempts[1], (0,), 4, Phase.RUNNING, plan, 2048, 500.0),
        2: Live(attempts[2], (1,), 5, Phase.RUNNING, None, 0, 500.0),
    }
    assert t.jobs == {1: jobs[0], 2: jobs[1]} and t.seq == 5


def test_recover_requeues_what_ran_with_no_keeper() -> None:
    t = Table()
    ran = Job(3, spec(), JobState.RUNNING, attempts=1, started_at=ISO)
    lost = Job(4, spec(), JobState.RUNNING, attempts=2, started_at=ISO)  # no attempt stored
    attempt = Attempt(3, 1, (0,), ISO, "", pid=55)
    out = run(t, c.Recover((ran, lost), {3: attempt}, frozenset(), {}, 10))
    requeued = replace(ran, state=JobState.QUEUED, reason=R.INTERRUPTED)
    requeued_lost = replace(lost, state=JobState.QUEUED, reason=R.INTERRUPTED)
    message = "the daemon stopped while this attempt ran"
    closed = replace(attempt, ended_at=ISO, reason="interrupted")
    assert out.writes == [
        c.SaveJob(requeued, ISO, (Event("interrupted", message),), None, closed),
        c.SaveJob(requeued_lost, ISO, (Event("interrupted", message),), None, None),
    ]
    assert out.actions == [c.Changed(None, requeued), c.Changed(None, requeued_lost)]


def test_recover_tracks_the_parents_of_queued_jobs_and_leaves_running_ones_be() -> None:
    t = Table()
    parent = Job(4, spec())
    child = Job(5, spec(after=(4,)))
    orphan = Job(6, spec(after=(9,)))
    adopted = Job(7, spec(after=(4,)), JobState.RUNNING, attempts=1, started_at=ISO)
    attempt = Attempt(7, 1, (0,), ISO, "", pid=77)
    cmd = c.Recover(
        (parent, child, orphan, adopted),
        {7: attempt},
        frozenset(),
        {9: JobState.FAILED},
        10,
        adopted={7: (77, None)},
    )
    out = run(t, cmd)
    assert t.pending == {5: frozenset({4})}
    assert t.jobs[5].waiting_for == "waiting for job 4"
    assert 6 not in t.jobs and t.jobs[7] == adopted
    saves = [w for w in out.writes if isinstance(w, c.SaveJob)]
    assert [(w.job.id, w.job.state, w.job.reason) for w in saves] == [
        (6, JobState.FAILED, R.DEPENDENCY_FAILED)
    ]


# (GPUs, the hold's reason, kinds with none free when the pass began) -> settled.
SETTLES = [
    (2, "gpus", frozenset({"gpu"}), [1]),
    (2, "gpus", frozenset(), []),  # told how many were free: not what a full pass says
    (1, "gpus", frozenset(), [1]),  # one unit, and the pass used the last one up
    (1, "vram", frozenset({"gpu"}), []),  # held for something else than its kind
    (0, "cpu", frozenset({"cpu"}), [1]),
    (0, "cpu", frozenset(), [1]),
    (0, "host_ram", frozenset({"cpu"}), []),
]


def test_a_job_held_for_its_kind_of_device_while_none_was_free_is_settled() -> None:
    for gpus, reason, full, settled in SETTLES:
        t = Table()
        run(t, c.SubmitJobs((spec(gpus=gpus),)))
        out = run(t, c.Dispatch((), (Hold(1, reason, "waiting"),), full=full))  # type: ignore[arg-type]
        assert out.changes.settle == settled, (gpus, reason, full)


def test_recover_takes_a_start_it_never_committed_from_the_keeper_with_its_moment() -> None:
    """Killed before the start's commit: the store has the claim's time and no pid; the
    keeper's record has both, and the attempt (and the job, on its first) start then."""
    t = Table()
    job = Job(8, spec(), JobState.RUNNING, attempts=1, started_at=ISO)
    attempt = Attempt(8, 1, (0,), ISO, "")
    began = epoch_from_iso(ISO) + 1.5
    cmd = c.Recover((job,), {8: attempt}, frozenset(), {}, 10, adopted={8: (88, began)})
    out = run(t, cmd)
    later = iso_from_epoch(began)
    moved = replace(attempt, pid=88, pid_start=began, started_at=later)
    assert out.writes == [c.SetPid(moved, later)]
    assert t.live[8].attempt == moved and t.jobs[8].started_at == later
