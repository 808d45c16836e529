"""The events' log lines: routine ones capped per second and summed up, every other one
always logged, and a commit's long tail told in one line."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.core.commands import InsertJob, SaveJob, Write
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Event
from supervisor.daemon import event_log as job_lines
from supervisor.daemon.event_log import JobLines


def job(job_id: int, state: JobState = JobState.RUNNING) -> Job:
    return Job(job_id, JobSpec(("true",), "/", {}, 0, 0), state)


def started(job_id: int) -> SaveJob:
    return SaveJob(job(job_id), "t", (Event("started", f"attempt 1 of {job_id}"),))


def succeeded(job_id: int) -> SaveJob:
    return SaveJob(job(job_id, JobState.SUCCEEDED), "t", (Event("exited", "exited 0"),))


def failed(job_id: int) -> SaveJob:
    return SaveJob(job(job_id, JobState.FAILED), "t", (Event("exited", "exited 1"),))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def logged(lines: JobLines, *commits: Sequence[Write]) -> list[MutableMapping[str, Any]]:
    with capture_logs() as out:
        for writes in commits:
            lines.log(writes)
    return out


def test_routine_lines_past_the_cap_are_counted_and_the_next_second_sums_them_up() -> None:
    clock = Clock()
    lines = JobLines(3, clock)
    out = logged(lines, *([started(i), succeeded(i)] for i in range(1, 6)))
    assert [(e["event_kind"], e["job_id"]) for e in out] == [
        ("started", 1),
        ("exited", 1),
        ("started", 2),
    ]
    clock.now += 1.0  # the next second: first what the last one left out
    out = logged(lines, [started(6)])
    assert out[0]["event"].startswith("routine job lines left out")
    assert (out[0]["left_out"], out[0]["started"], out[0]["exited"]) == (7, 3, 4)
    assert [(e.get("event_kind"), e.get("job_id")) for e in out[1:]] == [("started", 6)]


def test_every_line_that_is_not_routine_is_logged_past_the_cap() -> None:
    lines = JobLines(1, Clock())
    hang = SaveJob(job(9, JobState.QUEUED), "t", (Event("gpu_hang", "hung"),))
    cancel = SaveJob(job(10, JobState.CANCELLED), "t", (Event("cancelled", "cancelled"),))
    out = logged(lines, [started(1), started(2), failed(3), hang, cancel, succeeded(4)])
    assert [(e["event_kind"], e["job_id"]) for e in out] == [
        ("started", 1),
        ("exited", 3),
        ("gpu_hang", 9),
        ("cancelled", 10),
    ]
    assert out[1]["state"] == "failed"


def test_no_cap_logs_every_line_and_a_commit_past_ten_lines_gets_one_more() -> None:
    lines = JobLines(0, Clock())
    out = logged(lines, [started(i) for i in range(1, 31)])
    assert [e.get("job_id") for e in out[:10]] == list(range(1, 11))
    assert out[10]["event"] == "and 20 more" and len(out) == 11


def test_a_submit_is_one_line_a_job_or_one_for_a_batch() -> None:
    lines = JobLines(20, Clock())
    out = logged(
        lines, [InsertJob(job(1, JobState.QUEUED))], [InsertJob(job(i)) for i in range(2, 50)]
    )
    assert [e.get("job_id") for e in out] == [1, None]
    assert out[1]["job_ids"] == "2-49"


async def test_a_flood_that_stops_is_summed_up_a_second_later_without_another_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(job_lines, "WINDOW_S", 0.05)
    lines = JobLines(2)
    with capture_logs() as out:
        lines.log([started(1), started(2), started(3), succeeded(3)])
        assert len(out) == 2
        await asyncio.sleep(0.2)
    assert out[-1]["event"].startswith("routine job lines left out")
    assert (out[-1]["left_out"], out[-1]["per_s"]) == (2, 2)
    with capture_logs() as more:
        lines.flush()  # nothing left out since: nothing to say
    assert more == []


def test_a_success_is_routine_and_a_failure_to_be_retried_is_not() -> None:
    assert job_lines.routine("exited", job(1, JobState.SUCCEEDED))
    assert not job_lines.routine("exited", job(1, JobState.QUEUED))  # a failure to retry
    assert not job_lines.routine("interrupted", job(1, JobState.QUEUED))


def test_output_the_disk_refused_is_a_warning_as_a_hang_is() -> None:
    from supervisor.daemon.event_log import warns

    assert warns("output_dropped", None) and warns("gpu_hang", None)
    assert warns("exited", "spawn_failed") and not warns("exited", "exit_nonzero")
