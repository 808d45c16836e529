"""The job model's rules by table: every state pair, the stamps a transition writes, and the
classification of an exit. Each expected value is written out here, not derived from
jobs.TRANSITIONS."""

from __future__ import annotations

import signal

import pytest

from supervisor.core.jobs import (
    TERMINAL,
    UNCHARGED,
    ExitStatus,
    FailureReason,
    IllegalTransition,
    Job,
    JobSpec,
    JobState,
    classify_exit,
    transition,
)

Q, R, S, F, C = (
    JobState.QUEUED,
    JobState.RUNNING,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
)
ALLOWED = {
    (Q, R),  # dispatched
    (Q, C),  # cancelled while waiting
    (Q, F),  # a dependency failed, or the spawn produced no process
    (R, S),
    (R, F),
    (R, C),
    (R, Q),  # a retry, or an attempt interrupted by a restart
}
ALL_PAIRS = [(a, b) for a in JobState for b in JobState]


def job(state: JobState = Q, **changes: object) -> Job:
    spec = JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0)
    return Job(id=7, spec=spec, state=state, submitted_at="t0", **changes)  # type: ignore[arg-type]


def test_the_table_covers_twenty_five_pairs() -> None:
    assert len(ALL_PAIRS) == 25
    assert len(ALLOWED) == 7


@pytest.mark.parametrize(("frm", "to"), ALL_PAIRS, ids=lambda s: s.value)
def test_every_pair_is_allowed_or_raises(frm: JobState, to: JobState) -> None:
    if (frm, to) in ALLOWED:
        assert transition(job(frm), to, "t1").state is to
    else:
        with pytest.raises(IllegalTransition) as caught:
            transition(job(frm), to, "t1")
        assert (caught.value.job_id, caught.value.frm, caught.value.to) == (7, frm, to)
        assert str(caught.value) == f"job 7: illegal transition {frm.value} -> {to.value}"


def test_terminal_states_are_the_three_ends() -> None:
    assert {s for s in JobState if s.terminal} == {S, F, C}
    assert {S, F, C} == TERMINAL
    assert not Q.terminal and not R.terminal


def test_running_stamps_the_first_start_and_clears_the_wait() -> None:
    held = job(Q, waiting_for="VRAM", hold_reason="vram")
    started = transition(held, R, "t1")
    assert (started.started_at, started.ended_at) == ("t1", None)
    assert (started.waiting_for, started.hold_reason) == (None, None)
    # A retry keeps the first start.
    again = transition(transition(started, Q, "t2", FailureReason.EXIT_NONZERO), R, "t3")
    assert again.started_at == "t1"


def test_an_end_stamps_ended_at_and_clears_the_wait_and_keeps_the_reason() -> None:
    held = job(Q, waiting_for="host RAM", hold_reason="host_ram")
    ended = transition(held, F, "t9", FailureReason.DEPENDENCY_FAILED)
    assert (ended.ended_at, ended.started_at) == ("t9", None)
    assert (ended.waiting_for, ended.hold_reason) == (None, None)
    assert ended.reason is FailureReason.DEPENDENCY_FAILED


def test_back_to_queued_stamps_nothing() -> None:
    running = job(R, started_at="t1")
    queued = transition(running, Q, "t2", FailureReason.GPU_HANG, not_before=5.0)
    assert (queued.started_at, queued.ended_at) == ("t1", None)
    assert queued.reason is FailureReason.GPU_HANG
    assert queued.not_before == 5.0


def test_changes_are_applied_and_win_over_the_stamps() -> None:
    done = transition(job(R, started_at="t1"), S, "t2", None, exit_code=0, ended_at="t3")
    assert (done.exit_code, done.ended_at, done.reason) == (0, "t3", None)


def test_the_input_job_is_left_unchanged() -> None:
    before = job(Q)
    transition(before, R, "t1")
    assert before.state is Q and before.started_at is None


# ---- exit classification ----------------------------------------------------------------

KILL, TERM, SEGV = signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV
EXITS = [
    # (exit code, signal, oom evidence, hang evidence) -> reason
    ((0, None, False, False), None),
    ((1, None, False, False), FailureReason.EXIT_NONZERO),
    ((255, None, False, False), FailureReason.EXIT_NONZERO),
    ((0, None, True, False), None),  # a success stands whatever the log says about OOM
    ((0, None, False, True), FailureReason.GPU_HANG),  # a hang outranks everything
    ((1, None, True, False), FailureReason.EXIT_NONZERO),  # OOM needs a SIGKILL
    ((None, KILL, False, False), FailureReason.SIGNAL),
    ((None, KILL, True, False), FailureReason.OOM_KILLED),
    ((None, KILL, True, True), FailureReason.GPU_HANG),
    ((None, TERM, True, False), FailureReason.SIGNAL),  # only a SIGKILL is the OOM killer
    ((None, SEGV, False, False), FailureReason.SIGNAL),
    ((1, None, False, True), FailureReason.GPU_HANG),
]


@pytest.mark.parametrize(("case", "expected"), EXITS)
def test_classify_exit(
    case: tuple[int | None, int | None, bool, bool], expected: FailureReason | None
) -> None:
    code, sig, oom, hang = case
    status = ExitStatus(code, sig)
    assert classify_exit(status, oom_evidence=oom, hang_evidence=hang) is expected


def test_classify_exit_defaults_to_no_evidence() -> None:
    assert classify_exit(ExitStatus(None, 9)) is FailureReason.SIGNAL
    assert classify_exit(ExitStatus(3, None)) is FailureReason.EXIT_NONZERO


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (0, ExitStatus(0, None)),
        (3 << 8, ExitStatus(3, None)),
        (255 << 8, ExitStatus(255, None)),
        (9, ExitStatus(None, 9)),
        (15, ExitStatus(None, 15)),
    ],
)
def test_exit_status_from_a_wait_status(status: int, expected: ExitStatus) -> None:
    assert ExitStatus.from_wait_status(status) == expected


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (ExitStatus(0, None), 0),
        (ExitStatus(2, None), 2),
        (ExitStatus(None, 9), 137),
        (ExitStatus(None, None), 128),
    ],
)
def test_shell_code_is_128_plus_the_signal(status: ExitStatus, code: int) -> None:
    assert status.shell_code == code


def test_only_interruptions_and_cancels_are_uncharged() -> None:
    assert {FailureReason.INTERRUPTED, FailureReason.CANCELLED} == UNCHARGED
