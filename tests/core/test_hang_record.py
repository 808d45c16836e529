"""What a hang record holds: the machine's readings as taken when the hang was seen, then
the job's and the attempt's own fields, which no reading may overwrite."""

from __future__ import annotations

from supervisor.core.commands import Now
from supervisor.core.hang_record import hang_record
from supervisor.core.jobs import Job, JobSpec
from supervisor.core.records import Attempt

NOW = Now(1_700_000_000.0, 500.0)
SEEN = "2023-11-14T22:13:19.000Z"
ENDED = "2023-11-14T22:13:20.000Z"  # NOW as the engine writes it
HANG = {"source": "kernel_log", "lines": ["NVRM: Xid 79"]}


def spec(name: str = "", labels: dict[str, str] | None = None) -> JobSpec:
    return JobSpec(("x",), "/", {}, 0, 0, name=name, labels=labels or {})


def test_the_readings_of_the_moment_and_the_job_in_one_row() -> None:
    job = Job(7, spec("render", {"team": "vfx"}), progress="frame 17")
    attempt = Attempt(7, 3, (2, 3), "s", "k", evidence=HANG)
    machine = {"gpu": 3, "at": SEEN, "host_mem_available_mb": 900, "job": 99, "attempt": 99}
    assert hang_record(job, attempt, machine, NOW).row == {
        "gpu": 3,
        "at": SEEN,
        "host_mem_available_mb": 900,
        "job": 7,
        "attempt": 3,
        "evidence": HANG,
        "labels": {"team": "vfx"},
        "name": "render",
        "frame": "frame 17",
    }


def test_without_readings_the_first_card_of_the_attempt_and_now() -> None:
    job = Job(7, spec())
    attempt = Attempt(7, 1, (2, 3), "s", "k", evidence=HANG)
    assert hang_record(job, attempt, None, NOW).row == {
        "job": 7,
        "attempt": 1,
        "gpu": 2,
        "at": ENDED,
        "evidence": HANG,
        "labels": {},
        "name": None,
        "frame": None,
    }


def test_a_cpu_attempt_names_no_card() -> None:
    row = hang_record(Job(1, spec()), Attempt(1, 1, (), "s", "k"), {"at": None}, NOW).row
    assert (row["gpu"], row["at"]) == (None, ENDED)
