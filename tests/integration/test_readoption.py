"""gpusvd dies; the jobs do not. A new gpusvd takes them back from their keepers: same
pids, same attempt, and an exit that happened while no daemon ran with its true status."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.daemon.running.keeper_processes import keeper_processes

from .conftest import Daemon
from .keeper_fixture import alive

pytestmark = [
    pytest.mark.integration,
]


def keeper_pid(home: Path) -> int:
    """By its command line: a user's keeper answers no one else's ping, root's neither."""
    (found,) = [p.pid for p in keeper_processes(home.parent) if str(home) in p.info["cmdline"]]
    return found


def test_kill_9_keeps_jobs_and_a_new_daemon_takes_them_back(
    make_any_daemon: Callable[..., Daemon],
) -> None:
    d = make_any_daemon(gpus="2x8G", config="cpu_slots = 1\n")
    fifos = {name: d.root / f"{name}.fifo" for name in ("card0", "card1", "cpu", "three")}
    for fifo in fifos.values():
        os.mkfifo(fifo)
    script = "read code < {}; exit $code"
    jobs = {
        "card0": d.submit("sh", "-c", script.format(fifos["card0"]), gpus=1),
        "card1": d.submit("sh", "-c", script.format(fifos["card1"]), gpus=1),
        "cpu": d.submit("sh", "-c", script.format(fifos["cpu"]), gpus=0),
    }
    pids = {name: d.wait_pid(job) for name, job in jobs.items()}
    cards = {tuple(d.show(jobs[n])["gpus"]) for n in ("card0", "card1")}
    assert cards == {(0,), (1,)}
    d.kill9()
    assert all(alive(pid) for pid in pids.values())  # the keepers still hold them
    fifos["cpu"].write_text("0\n")  # ends while no daemon runs
    d.wait_for(lambda: not alive(pids["cpu"]), what="the CPU job's exit")
    d.start()
    for name in ("card0", "card1"):
        shown = d.wait_state(jobs[name], "running")
        assert [a["pid"] for a in shown["attempts"]] == [pids[name]]
        assert shown["attempts"][0]["n"] == 1 and shown["attempts"][0]["ended_at"] is None
    cpu = d.wait_done(jobs["cpu"])
    assert cpu["state"] == "succeeded" and len(cpu["attempts"]) == 1
    for name in ("card0", "card1"):
        fifos[name].write_text("0\n")
        done = d.wait_done(jobs[name])
        assert done["state"] == "succeeded"
        assert [a["n"] for a in done["attempts"]] == [1]


def test_an_exit_while_no_daemon_runs_is_recorded_with_its_status(
    make_any_daemon: Callable[..., Daemon],
) -> None:
    d = make_any_daemon(gpus="2x8G")
    fifo = d.root / "three.fifo"
    os.mkfifo(fifo)
    job = d.submit("sh", "-c", f"read code < {fifo}; exit $code", retries=0)
    pid = d.wait_pid(job)
    d.kill9()
    fifo.write_text("3\n")
    d.wait_for(lambda: not alive(pid), what="the job's exit")
    d.start()
    done = d.wait_done(job)
    assert done["state"] == "failed" and done["exit_code"] == 3
    assert [a["reason"] for a in done["attempts"]] == ["exit_nonzero"]


def test_a_keeper_that_dies_costs_its_jobs_one_attempt_of_their_budget(
    make_any_daemon: Callable[..., Daemon],
) -> None:
    d = make_any_daemon(gpus="2x8G")
    job = d.submit("sleep", "300")
    pid = d.wait_pid(job)
    (card,) = d.show(job)["gpus"]
    keeper = keeper_pid(d.state / "keepers" / f"gpu{card}")
    os.kill(keeper, signal.SIGKILL)
    d.wait_for(lambda: not alive(pid), what="the job killed: its keeper is gone")
    again = d.wait_for(lambda: len((j := d.show(job))["attempts"]) == 2 and j, what="a retry")
    assert again["attempts"][0]["reason"] == "interrupted"
    assert again["attempts"][0]["evidence"]["keeper"] == f"gpu{card}"
    assert again["retries"]["ordinary"]["used"] == 1
    d.cli("cancel", str(job))
    assert d.wait_done(job)["state"] == "cancelled"
