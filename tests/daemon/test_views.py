"""The job object that clients see (CONTRACT.md "The job object"), written out field by
field; what anyone may see of someone else's job; and the live flags."""

from __future__ import annotations

from typing import Any

from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt
from supervisor.core.table import Live, Phase, Table
from supervisor.daemon.views import job_json, public_view, starting, stopping

SPEC = JobSpec(
    argv=("python", "t.py"), cwd="/w", env={"SECRET": "hunter2"}, owner_uid=1001, owner_gid=1001,
    name="train", labels={"team": "v"}, gpus=2, vram_mb=1000, mem_mb=2000, mem_key="k",
    mem_scale=1.5, retries=3, gpu_hang_retries=20, priority=4, after=(3,), time_limit_s=60.0,
    share=False, array_id=7, array_index=2, max_running=1,
)  # fmt: skip
JOB = Job(
    9, SPEC, JobState.FAILED, "2026-01-02T03:00:00.000Z", "2026-01-02T03:00:01.000Z",
    "2026-01-02T03:00:09.000Z", None, None, FailureReason.EXIT_NONZERO, 2, 1, 0, (0, 3), 1,
    0.0, "step 5", False,
)  # fmt: skip
ATTEMPT = Attempt(
    9, 1, (0, 3), "2026-01-02T03:00:01.000Z", "k", pid=77, ended_at="2026-01-02T03:00:09.000Z",
    exit_code=2, reason="exit_nonzero", peak_rss_mb=512, gpu_uuids=("GPU-a", "GPU-b"),
)  # fmt: skip

FULL = {
    "id": 9,
    "name": "train",
    "argv": ["python", "t.py"],
    "cwd": "/w",
    "owner_uid": 1001,
    "labels": {"team": "v"},
    "mem_key": "k",
    "state": "failed",
    "stopping": False,
    "starting": False,
    "waiting_for": None,
    "gpus_requested": 2,
    "gpus": [0, 3],
    "host_memory": {"projected_mb": 2100, "basis": "declared", "runs": 0, "peak_mb": None},
    "retries": {"ordinary": {"used": 1, "budget": 3}, "gpu_hang": {"used": 0, "budget": 20}},
    "reason": "exit_nonzero",
    "exit_code": 2,
    "priority": 4,
    "after": [3],
    "after_any": [],
    "progress": "step 5",
    "vram_mb": 1000,
    "share": False,
    "array_id": 7,
    "array_index": 2,
    "array": {"id": 7, "index": 2},
    "max_running": 1,
    "mem_mb": 2000,
    "mem_scale": 1.5,
    "submitted_at": "2026-01-02T03:00:00.000Z",
    "started_at": "2026-01-02T03:00:01.000Z",
    "ended_at": "2026-01-02T03:00:09.000Z",
    "held": False,
    "time_limit_s": 60.0,
    "cards": None,
}


def test_the_job_object_field_by_field_never_its_env() -> None:
    out = job_json(JOB, host_memory=Projection(2100, "declared", 0))
    assert out == FULL
    assert "env" not in out and "hunter2" not in str(out)


def test_attempts_and_events_when_asked_for() -> None:
    events = [{"at": "2026-01-02T03:00:00.000Z", "kind": "submitted", "message": "submitted"}]
    out = job_json(
        JOB, host_memory=None, attempts=[ATTEMPT], events=events, stopping=True, starting=True
    )
    assert out["host_memory"] is None and out["stopping"] is True and out["starting"] is True
    assert out["attempts"] == [
        {
            "n": 1,
            "gpus": [0, 3],
            "gpu_uuids": ["GPU-a", "GPU-b"],
            "pid": 77,
            "started_at": "2026-01-02T03:00:01.000Z",
            "ended_at": "2026-01-02T03:00:09.000Z",
            "exit_code": 2,
            "signal": None,
            "reason": "exit_nonzero",
            "peak_rss_mb": 512,
            "peak_vram_mb": None,
            "evidence": None,
            "stopping": None,
            "output_dropped_bytes": 0,
        }
    ]
    assert out["events"] == events
    assert out["output_dropped_bytes"] == 0
    assert "attempts" not in job_json(JOB, host_memory=None)
    assert "events" not in job_json(JOB, host_memory=None)


def test_output_dropped_is_summed_from_its_events_per_attempt_and_in_all() -> None:
    events: list[dict[str, Any]] = [
        {"at": "t", "kind": "output_dropped", "message": "m", "bytes": 100, "attempt": 1},
        {"at": "t", "kind": "exited", "message": "exited 0"},
        {"at": "t", "kind": "output_dropped", "message": "m", "bytes": 5, "attempt": 2},
    ]
    out = job_json(JOB, host_memory=None, attempts=[ATTEMPT], events=events)
    assert out["output_dropped_bytes"] == 105
    assert out["attempts"][0]["output_dropped_bytes"] == 100


def test_a_queued_job_has_no_reason_and_its_hold_shows() -> None:
    queued = Job(4, SPEC, waiting_for="waiting for host RAM", held=True, submitted_at="t")
    out = job_json(queued, host_memory=None)
    assert (out["state"], out["reason"], out["exit_code"], out["gpus"]) == (
        "queued",
        None,
        None,
        [],
    )
    assert (out["waiting_for"], out["held"], out["started_at"]) == (
        "waiting for host RAM", True, None,
    )  # fmt: skip


def test_the_public_view_holds_no_text_of_the_job() -> None:
    full = job_json(JOB, host_memory=None)
    assert public_view(full) == {
        "id": 9,
        "state": "failed",
        "owner_uid": 1001,
        "gpus": [0, 3],
        "gpus_requested": 2,
        "waiting_for": None,
        "submitted_at": "2026-01-02T03:00:00.000Z",
    }


def live(phase: Phase, kill: FailureReason | None = None) -> Live:
    return Live(ATTEMPT, (0,), 1, phase, None, 0, 0.0, kill=kill)


def test_stopping_and_starting_read_the_live_attempt() -> None:
    table = Table()
    table.live[1] = live(Phase.RUNNING)
    table.live[2] = live(Phase.RUNNING, FailureReason.CANCELLED)
    table.live[3] = live(Phase.CLAIMED)
    table.live[4] = live(Phase.SPAWNING)
    assert [stopping(table, i) for i in (1, 2, 3, 4, 5)] == [False, True, False, False, False]
    assert [starting(table, i) for i in (1, 2, 3, 4, 5)] == [False, False, True, True, False]
