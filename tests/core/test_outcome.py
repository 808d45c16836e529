"""The end of an attempt: every failure reason against every budget state, from a table
whose expected values are written out, not computed."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from supervisor.core.jobs import ExitStatus, FailureReason, Job, JobSpec, JobState
from supervisor.core.outcome import Facts, end_of_attempt, failure, keeper_death, reclassified
from supervisor.core.records import Attempt

AT, NOW = "2026-01-01T00:00:00.000Z", 1000.0
HANG = {"source": "kernel_log", "lines": ["NVRM: Xid 79"]}
R = FailureReason


def job(ordinary_used: int, hang_used: int) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, retries=3, gpu_hang_retries=20)
    return Job(
        1, spec, JobState.RUNNING, attempts=1, ordinary_used=ordinary_used, gpu_hang_used=hang_used
    )


ATTEMPT = Attempt(1, 1, (0,), AT, "k")
KILLED = ExitStatus(None, signal.SIGKILL)
TERMED = ExitStatus(None, signal.SIGTERM)

FACTS: dict[str, Facts] = {
    "success": Facts(ExitStatus(0, None)),
    "success despite a hang line": Facts(ExitStatus(0, None), hang=HANG),
    "exit 1": Facts(ExitStatus(1, None)),
    "a signal": Facts(TERMED),
    "SIGKILL with OOM evidence": Facts(KILLED, oom="kernel_log"),
    "SIGKILL without evidence": Facts(KILLED),
    "exit 1 near a reset line": Facts(ExitStatus(1, None), hang=HANG),
    "SIGKILL near a reset line and an OOM": Facts(KILLED, hang=HANG, oom="kernel_log"),
    "killed for a hang": Facts(TERMED, killed_for=R.GPU_HANG, kill_evidence=HANG),
    "killed by the squeeze guard": Facts(KILLED, killed_for=R.OOM_KILLED),
    "cancelled while running": Facts(TERMED, killed_for=R.CANCELLED),
    "cancelled before it started": Facts(None, killed_for=R.CANCELLED),
    "drained while running": Facts(TERMED, killed_for=R.INTERRUPTED),
    "drained before it started": Facts(None, killed_for=R.INTERRUPTED),
    "its keeper died": Facts(
        KILLED, killed_for=R.INTERRUPTED, kill_evidence=keeper_death("gpu0", 4242)
    ),
    "spawn failed": Facts(None, spawn_error="executable not found: x"),
    "cancelled, and the spawn failed": Facts(None, killed_for=R.CANCELLED, spawn_error="e"),
}
BUDGETS = {"fresh": (0, 0), "ordinary spent": (3, 0), "hang spent": (0, 20), "both spent": (3, 20)}

# facts -> (reason, {budget state: (final state, ordinary used, hang used, delay)}).
# A retry's delay: 2**ordinary_used for the ordinary budget, 1 s for the hang budget,
# 0 for an interruption (charged to nothing).
Q, F, C, S = JobState.QUEUED, JobState.FAILED, JobState.CANCELLED, JobState.SUCCEEDED
Ends = dict[str, tuple[JobState, int, int, float | None]]
ORDINARY: Ends = {"fresh": (Q, 1, 0, 1.0), "ordinary spent": (F, 3, 0, None)}
ORDINARY |= {"hang spent": (Q, 1, 20, 1.0), "both spent": (F, 3, 20, None)}
HANGS: Ends = {"fresh": (Q, 0, 1, 1.0), "ordinary spent": (Q, 3, 1, 1.0)}
HANGS |= {"hang spent": (F, 0, 20, None), "both spent": (F, 3, 20, None)}
DONE = {b: (S, *BUDGETS[b], None) for b in BUDGETS}
CANCEL = {b: (C, *BUDGETS[b], None) for b in BUDGETS}
REQUEUE = {b: (Q, *BUDGETS[b], 0.0) for b in BUDGETS}
NEVER = {b: (F, *BUDGETS[b], None) for b in BUDGETS}
EXPECTED: dict[str, tuple[FailureReason | None, dict[str, tuple[Any, ...]]]] = {
    "success": (None, DONE),
    "success despite a hang line": (None, DONE),
    "exit 1": (R.EXIT_NONZERO, ORDINARY),
    "a signal": (R.SIGNAL, ORDINARY),
    "SIGKILL with OOM evidence": (R.OOM_KILLED, ORDINARY),
    "SIGKILL without evidence": (R.SIGNAL, ORDINARY),
    "exit 1 near a reset line": (R.GPU_HANG, HANGS),
    "SIGKILL near a reset line and an OOM": (R.GPU_HANG, HANGS),
    "killed for a hang": (R.GPU_HANG, HANGS),
    "killed by the squeeze guard": (R.OOM_KILLED, ORDINARY),
    "cancelled while running": (R.CANCELLED, CANCEL),
    "cancelled before it started": (R.CANCELLED, CANCEL),
    "drained while running": (R.INTERRUPTED, REQUEUE),
    "drained before it started": (R.INTERRUPTED, REQUEUE),
    "its keeper died": (R.INTERRUPTED, ORDINARY),
    "spawn failed": (R.SPAWN_FAILED, NEVER),
    "cancelled, and the spawn failed": (R.CANCELLED, CANCEL),
}


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("case", FACTS)
def test_every_reason_against_every_budget(case: str, budget: str) -> None:
    reason, by_budget = EXPECTED[case]
    state, ordinary, hang, delay = by_budget[budget]
    out = end_of_attempt(job(*BUDGETS[budget]), ATTEMPT, FACTS[case], AT, NOW)
    assert out.attempt.reason == (reason.value if reason else None)
    assert (out.job.state, out.job.reason) == (state, reason)
    assert (out.job.ordinary_used, out.job.gpu_hang_used) == (ordinary, hang)
    assert out.job.not_before == (NOW + delay if delay else 0.0)
    assert out.attempt.ended_at == AT


def test_evidence_goes_with_its_reason() -> None:
    assert failure(FACTS["exit 1 near a reset line"]) == (R.GPU_HANG, HANG)
    assert failure(FACTS["SIGKILL with OOM evidence"]) == (R.OOM_KILLED, {"source": "kernel_log"})
    assert failure(FACTS["spawn failed"]) == (
        R.SPAWN_FAILED,
        {"message": "executable not found: x"},
    )
    assert failure(FACTS["exit 1"]) == (R.EXIT_NONZERO, None)


def test_the_events_say_what_happened() -> None:
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["exit 1 near a reset line"], AT, NOW)
    assert [e.kind for e in out.events] == ["gpu_hang", "exited", "retry_scheduled"]
    assert out.events[2].message == "retry in 1s (gpu_hang budget)"
    out = end_of_attempt(job(2, 0), ATTEMPT, FACTS["exit 1"], AT, NOW)
    assert [e.message for e in out.events] == [
        "exit_nonzero: exit code 1",
        "retry in 4s (ordinary budget)",
    ]
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["cancelled while running"], AT, NOW)
    assert [e.kind for e in out.events] == ["exited", "cancelled"]
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["drained while running"], AT, NOW)
    assert [e.kind for e in out.events] == ["exited", "interrupted"]


def test_output_the_disk_refused_is_an_event_whatever_the_end() -> None:
    ok = Facts(ExitStatus(0, None), output_dropped=4096)
    out = end_of_attempt(job(0, 0), ATTEMPT, ok, AT, NOW)
    assert out.job.state is JobState.SUCCEEDED
    assert [e.kind for e in out.events] == ["output_dropped", "exited"]
    assert out.events[0].data == {"bytes": 4096, "attempt": 1}
    out = end_of_attempt(job(0, 0), ATTEMPT, FACTS["exit 1"], AT, NOW)
    assert "output_dropped" not in [e.kind for e in out.events]


# ---- a reset line that arrives after the exit ------------------------------------------

ENDED = Attempt(1, 1, (0,), AT, "k", ended_at=AT, exit_code=1, reason="exit_nonzero")


def queued_retry(ordinary_used: int = 1, attempts: int = 1) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0, retries=3, gpu_hang_retries=20)
    return Job(
        1,
        spec,
        JobState.QUEUED,
        reason=R.EXIT_NONZERO,
        attempts=attempts,
        ordinary_used=ordinary_used,
        not_before=NOW + 1,
    )


def test_a_late_line_moves_the_queued_retry_to_the_hang_budget() -> None:
    out = reclassified(queued_retry(), ENDED, HANG)
    assert out is not None
    assert (out.job.state, out.job.reason) == (JobState.QUEUED, R.GPU_HANG)
    assert (out.job.ordinary_used, out.job.gpu_hang_used) == (0, 1)
    assert (out.attempt.reason, out.attempt.evidence) == ("gpu_hang", HANG)
    assert out.attempt.exit_code == 1 and out.attempt.ended_at == AT
    assert [e.kind for e in out.events] == ["gpu_hang"]


@pytest.mark.parametrize(
    ("current", "attempt"),
    [
        (Job(1, queued_retry().spec, JobState.FAILED, attempts=1), ENDED),  # too late: it ended
        (queued_retry(attempts=2), ENDED),  # a later attempt is what is queued now
        (queued_retry(), Attempt(1, 1, (0,), AT, "k", reason="oom_killed")),  # not a crash
        (queued_retry(), Attempt(1, 1, (0,), AT, "k", reason="gpu_hang")),  # already a hang
    ],
)
def test_a_late_line_changes_nothing_it_cannot_explain(current: Job, attempt: Attempt) -> None:
    assert reclassified(current, attempt, HANG) is None


# ---- the whole outcome, field by field -------------------------------------------------

# case -> (facts, (ordinary used, hang used) before, the job after, the attempt after, events)
# The job after: (state, reason, ended_at, exit_code, not_before, ordinary, hang used).
# The attempt after: (exit_code, signal, reason, peak_rss_mb, peak_vram_mb, evidence).
# Events: (kind, message, data).
WHOLE: dict[str, tuple[Facts, tuple[int, int], tuple[Any, ...], tuple[Any, ...], list[Any]]] = {
    "success, its peaks kept": (
        Facts(ExitStatus(0, None), peak_rss_mb=512, peak_vram_mb=0),
        (1, 2),
        (S, None, AT, 0, 0.0, 1, 2),
        (0, None, None, 512, None, None),
        [("exited", "exited 0", {"exit_code": 0})],
    ),
    "exit 1, retried": (
        Facts(ExitStatus(1, None), peak_rss_mb=100, peak_vram_mb=2000),
        (0, 0),
        (Q, R.EXIT_NONZERO, None, None, NOW + 1, 1, 0),
        (1, None, "exit_nonzero", 100, 2000, None),
        [
            ("exited", "exit_nonzero: exit code 1", {"reason": "exit_nonzero"}),
            (
                "retry_scheduled",
                "retry in 1s (ordinary budget)",
                {"budget": "ordinary", "delay_s": 1.0},
            ),
        ],
    ),
    "OOM-killed with the budget spent": (
        Facts(KILLED, oom="kernel_log"),
        (3, 0),
        (F, R.OOM_KILLED, AT, 137, 0.0, 3, 0),
        (None, 9, "oom_killed", None, None, {"source": "kernel_log"}),
        [("exited", "oom_killed: killed by signal 9", {"reason": "oom_killed"})],
    ),
    "exit 1 near a reset line": (
        Facts(ExitStatus(1, None), hang=HANG),
        (2, 5),
        (Q, R.GPU_HANG, None, None, NOW + 1, 2, 6),
        (1, None, "gpu_hang", None, None, HANG),
        [
            ("gpu_hang", "attempt failed as gpu_hang", None),
            ("exited", "gpu_hang: exit code 1", {"reason": "gpu_hang"}),
            (
                "retry_scheduled",
                "retry in 1s (gpu_hang budget)",
                {"budget": "gpu_hang", "delay_s": 1.0},
            ),
        ],
    ),
    "cancelled while running": (
        Facts(TERMED, killed_for=R.CANCELLED),
        (0, 0),
        (C, R.CANCELLED, AT, 143, 0.0, 0, 0),
        (None, 15, "cancelled", None, None, None),
        [
            ("exited", "cancelled: killed by signal 15", {"reason": "cancelled"}),
            ("cancelled", "cancelled while running", None),
        ],
    ),
    "drained while running": (
        Facts(TERMED, killed_for=R.INTERRUPTED),
        (1, 0),
        (Q, R.INTERRUPTED, None, None, 0.0, 1, 0),
        (None, 15, "interrupted", None, None, None),
        [
            ("exited", "interrupted: killed by signal 15", {"reason": "interrupted"}),
            ("interrupted", "interrupted by a daemon stop; requeued", None),
        ],
    ),
    "stopped before it started, no reason given": (
        Facts(None),
        (0, 0),
        (Q, R.INTERRUPTED, None, None, 0.0, 0, 0),
        (None, None, "interrupted", None, None, None),
        [
            ("exited", "interrupted: interrupted", {"reason": "interrupted"}),
            ("interrupted", "interrupted by a daemon stop; requeued", None),
        ],
    ),
    "past its time limit before it started": (
        Facts(None, killed_for=R.TIMEOUT, kill_evidence={"limit_s": 2.5}),
        (0, 0),
        (F, R.TIMEOUT, AT, None, 0.0, 0, 0),
        (None, None, "timeout", None, None, {"limit_s": 2.5}),
        [("exited", "timeout: past its wall-time limit of 2.5s", {"reason": "timeout"})],
    ),
    "past its time limit while running": (
        Facts(TERMED, killed_for=R.TIMEOUT, kill_evidence={"limit_s": 30.0}),
        (0, 0),
        (F, R.TIMEOUT, AT, 143, 0.0, 0, 0),
        (None, 15, "timeout", None, None, {"limit_s": 30.0}),
        [("exited", "timeout: past its wall-time limit of 30s", {"reason": "timeout"})],
    ),
    "a limit in the evidence of another reason is not its message": (
        Facts(TERMED, killed_for=R.OOM_KILLED, kill_evidence={"limit_s": 30.0}),
        (3, 0),
        (F, R.OOM_KILLED, AT, 143, 0.0, 3, 0),
        (None, 15, "oom_killed", None, None, {"limit_s": 30.0}),
        [("exited", "oom_killed: killed by signal 15", {"reason": "oom_killed"})],
    ),
}


@pytest.mark.parametrize("case", WHOLE)
def test_the_whole_outcome(case: str) -> None:
    facts, used, want_job, want_attempt, want_events = WHOLE[case]
    out = end_of_attempt(job(*used), ATTEMPT, facts, AT, NOW)
    j, a = out.job, out.attempt
    got_job = (j.state, j.reason, j.ended_at, j.exit_code, j.not_before)
    assert (*got_job, j.ordinary_used, j.gpu_hang_used) == want_job
    got = (a.exit_code, a.signal, a.reason, a.peak_rss_mb, a.peak_vram_mb, a.evidence)
    assert got == want_attempt
    assert (a.ended_at, a.n, a.gpus, a.started_at) == (AT, 1, (0,), AT)
    assert [(e.kind, e.message, e.data) for e in out.events] == want_events


def test_a_late_line_gives_back_one_ordinary_retry_and_says_so() -> None:
    out = reclassified(queued_retry(ordinary_used=2), ENDED, HANG)
    assert out is not None
    assert (out.job.ordinary_used, out.job.gpu_hang_used) == (1, 1)
    assert [(e.kind, e.message, e.data) for e in out.events] == [
        ("gpu_hang", "attempt 1 reclassified as gpu_hang: a reset line for its GPU followed", None)
    ]
