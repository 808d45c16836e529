"""Keepers are watched, a keeper's death costs its jobs one attempt, and no job runs
outside its cgroup: with a real gpusvd, real keepers, real cgroups."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon.cgroups import keeper_roots
from supervisor.daemon.running.keepers import cgroup_tag
from supervisor.keeper.client import pid_of

from .conftest import Daemon
from .keeper_fixture import alive

pytestmark = [pytest.mark.integration]

FAST = "[jobs]\nkeeper_silent_s = 1\nkill_grace_s = 0.5\n"


def keeper_pid(home: Path) -> int:
    """The keeper that serves `home` now (it answers its ping)."""
    pid: int | None = None

    def answered() -> bool:
        nonlocal pid
        pid = pid_of(home)
        return pid is not None

    assert wait_until(answered), f"no keeper answers at {home}"
    assert pid is not None
    return pid


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def health(d: Daemon) -> dict[str, Any]:
    answer: dict[str, Any] = d.call({"type": "health"})["health"]
    return answer


def keeper_field(d: Daemon, card: int) -> str | None:
    (shown,) = [g for g in d.call({"type": "gpus"})["gpus"] if g["index"] == card]
    value: str | None = shown["keeper"]
    return value


def said(d: Daemon, job: dict[str, Any]) -> str:
    return "\n".join(e["message"] for e in job["events"])


def test_a_keeper_that_dies_costs_its_job_one_attempt_and_is_named(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G")
    once = d.submit("sleep", "300", retries=0)
    pid = d.wait_pid(once)
    keeper = keeper_pid(d.state / "keepers" / "gpu0")
    os.kill(keeper, signal.SIGKILL)
    done = d.wait_done(once)
    assert (done["state"], done["reason"]) == ("failed", "interrupted")
    assert [a["reason"] for a in done["attempts"]] == ["interrupted"]  # ran once
    assert f"interrupted: keeper gpu0 died (pid {keeper})" in said(d, done)
    assert "daemon stop" not in said(d, done)
    assert not alive(pid)
    twice = d.submit("sleep", "300", retries=1)
    for _ in range(2):  # each run's keeper killed under it: two runs, then no more
        d.wait_pid(twice)
        os.kill(keeper_pid(d.state / "keepers" / "gpu0"), signal.SIGKILL)
        d.wait_for(lambda: d.show(twice)["state"] != "running", what="its end")
    done = d.wait_done(twice)
    assert (done["state"], done["reason"]) == ("failed", "interrupted")
    assert [a["reason"] for a in done["attempts"]] == ["interrupted", "interrupted"]
    assert done["retries"]["ordinary"] == {"used": 1, "budget": 1}


@pytest.mark.root("job cgroups need root")
def test_a_stopped_keeper_is_said_its_job_killed_through_its_cgroup_and_all_back_on_sigcont(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=FAST)
    stubborn = d.submit("sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300")
    pid = d.wait_pid(stubborn)
    keeper = keeper_pid(d.state / "keepers" / "gpu0")
    assert keeper_field(d, 0) == "ok"
    os.kill(keeper, signal.SIGSTOP)
    try:
        says = f"keeper gpu0 (pid {keeper}) not answering"
        d.wait_for(
            lambda: any(p.startswith(says) for p in health(d)["problems"]), what="health to say so"
        )
        assert keeper_field(d, 0) == "not answering"
        assert "keeper not answering" in d.log_text() and "card=0" in d.log_text()
        d.cli("cancel", str(stubborn))
        done = d.wait_done(stubborn)  # SIGTERM ignored: its cgroup was killed
        assert done["state"] == "cancelled" and not alive(pid)
        assert "stopping its job through its cgroup" in d.log_text()
        waiting = d.submit("true")
        assert d.show(waiting)["state"] == "queued"  # the card takes no new job
    finally:
        os.kill(keeper, signal.SIGCONT)
    d.wait_for(lambda: health(d)["ok"], what="health ok again")
    assert keeper_field(d, 0) == "ok" and keeper_pid(d.state / "keepers" / "gpu0") == keeper
    assert d.wait_done(waiting)["state"] == "succeeded"
    assert "keeper answers again" in d.log_text()


def test_a_keeper_stopped_across_a_restart_keeps_no_card_from_serving_and_is_taken_back(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G", config=FAST)
    job = d.submit("sleep", "300")
    pid = d.wait_pid(job)
    (card,) = d.show(job)["gpus"]
    keeper = keeper_pid(d.state / "keepers" / f"gpu{card}")
    os.kill(keeper, signal.SIGSTOP)
    try:
        d.kill9()
        d.start()  # does not wait for the stopped keeper past its attach deadline
        problem = f"keeper gpu{card} did not answer gpusvd's attach: its card takes no new jobs"
        assert problem in health(d)["problems"]
        assert keeper_field(d, card) == "not answering"
        again = d.wait_pid(job)  # its attempt closed, nothing of it left: run on the other card
        assert not alive(pid) and again != pid
        shown = d.show(job)
        assert shown["gpus"] == [1 - card]
        assert shown["attempts"][0]["reason"] == "interrupted"
    finally:
        os.kill(keeper, signal.SIGCONT)
    d.wait_for(lambda: health(d)["ok"], what="the keeper taken back")
    assert keeper_field(d, card) == "ok"
    assert "keeper answers again: attached" in d.log_text()
    d.cli("cancel", str(job))
    assert d.wait_done(job)["state"] == "cancelled"


@contextmanager
def no_new_groups_under(root: Path) -> Iterator[None]:
    """cgroup.max.descendants 0: no cgroup can be made under `root`, as where a keeper
    may not write."""
    (root / "cgroup.max.descendants").write_text("0")
    try:
        yield
    finally:
        (root / "cgroup.max.descendants").write_text("max")


@pytest.mark.root("job cgroups need root")
def test_a_vanished_cgroup_root_is_made_again_and_a_job_without_a_cgroup_never_starts(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G")
    v2, memcg = keeper_roots(cgroup_tag(d.state))
    assert v2 is not None, "no unified cgroup hierarchy"
    root = v2 / "keeper-gpu0"
    assert d.wait_done(d.submit("true"))["state"] == "succeeded"  # the keeper is up
    roots = [root] + ([] if memcg is None else [memcg / "keeper-gpu0"])
    d.wait_for(
        lambda: not any(p.is_dir() for r in roots for p in r.iterdir()), what="its groups removed"
    )
    for gone in roots:
        gone.rmdir()  # as a crash restart under systemd may remove them
    ran = d.submit("cat", "/proc/self/cgroup")
    assert d.wait_done(ran)["state"] == "succeeded"
    assert f"keeper-gpu0/job-{ran}-1" in (d.state / "logs" / f"{ran}.out").read_text()
    assert "was missing: made again" in (d.state / "keepers" / "gpu0" / "log").read_text()
    with no_new_groups_under(root):
        refused = d.wait_done(d.submit("true"))
        assert (refused["state"], refused["reason"]) == ("failed", "spawn_failed")
        (attempt,) = refused["attempts"]
        assert attempt["evidence"]["kind"] == "cgroup"
        assert "cannot make cgroup" in attempt["evidence"]["message"]
        problems = health(d)["problems"]
        assert any(
            p.startswith("keeper gpu0: jobs not started: cannot make cgroup") for p in problems
        )
        assert "job not started" in d.log_text() and "kind=cgroup" in d.log_text()
    assert d.wait_done(d.submit("true"))["state"] == "succeeded"
    assert health(d)["ok"]
