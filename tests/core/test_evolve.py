"""evolve: the same copy as dataclasses.replace, taken without __init__ where that is
the same."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import ClassVar

import pytest

from supervisor.core.evolve import evolve
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Attempt


def _job() -> Job:
    spec = JobSpec(("true",), "/", {"A": "b"}, 1000, 1000)
    return Job(7, spec, JobState.QUEUED, "2026-01-01T00:00:00Z")


def test_a_job_is_copied_as_replace_copies_it() -> None:
    job = _job()
    new = evolve(job, waiting_for="w", hold_reason="gpus")
    assert new == dataclasses.replace(job, waiting_for="w", hold_reason="gpus")
    assert type(new) is Job and new is not job
    assert (job.waiting_for, job.hold_reason) == (None, None)  # the original is unchanged
    assert new.spec is job.spec  # shallow, as replace
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.state = JobState.RUNNING  # type: ignore[misc]


def test_an_attempt_is_copied_as_replace_copies_it() -> None:
    a = Attempt(job_id=1, n=1, gpus=(0,), started_at="t", mem_key="k")
    assert evolve(a, pid=5, pid_start=1.5) == dataclasses.replace(a, pid=5, pid_start=1.5)


def test_an_unknown_name_raises_as_replace_does() -> None:
    with pytest.raises(TypeError):
        evolve(_job(), no_such_field=1)


@dataclass(frozen=True)
class _Checked:
    n: int
    doubled: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "doubled", 2 * self.n)


@dataclass
class _Fresh:
    n: int
    seen: list[int] = field(init=False, default_factory=list)


@dataclass
class _WithInitVar:
    n: int
    scale: InitVar[int] = 1
    kind: ClassVar[str] = "x"


@dataclass
class _Plain:
    n: int
    kind: ClassVar[str] = "x"


@dataclass(init=False)
class _OwnInit:
    n: int
    twice: int

    def __init__(self, n: int, twice: int = 0) -> None:
        self.n, self.twice = n, 2 * n


def test_classes_whose_init_does_more_go_through_replace() -> None:
    assert evolve(_OwnInit(1, 0), n=3).twice == 6  # its own __init__ ran
    assert evolve(_Checked(1), n=4).doubled == 8  # __post_init__ ran
    old = _Fresh(1)
    old.seen.append(1)
    assert evolve(old, n=2).seen == []  # an init=False field is built anew
    assert evolve(_WithInitVar(1), n=2, scale=3).n == 2


def test_a_classvar_does_not_stop_the_copy() -> None:
    assert evolve(_Plain(1), n=2) == _Plain(2)
