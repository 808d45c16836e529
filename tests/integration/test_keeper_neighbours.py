"""One submit, or one lost connection, costs no other job on the same keeper.

A client's request and gpusvd's line to the keeper use one encoding and one limit, so a
large non-ASCII environment that gpusvd took is a spawn the keeper takes too; and a
connection to a keeper that closes while the keeper lives is made again, its jobs
watched on: none of them `interrupted`, none run twice."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import pytest

from supervisor.keeper.client import pid_of
from supervisor.wire.framing import MAX_LINE

from .conftest import Daemon
from .keeper_fixture import alive

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="job cgroups need root"),
]


def _kinds(job: dict[str, Any]) -> list[str]:
    return [str(e["kind"]) for e in job["events"]]


def test_a_large_non_ascii_environment_costs_the_job_beside_it_nothing(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None, config="cpu_slots = 2\n")
    fifo = d.root / "neighbour.fifo"
    os.mkfifo(fifo)
    neighbour = d.submit("sh", "-c", f"read code < {fifo}; exit $code", gpus=0, retries=0)
    pid = d.wait_pid(neighbour)
    # Each variable under the kernel's 128 KiB a string; all of it near the client's
    # 1 MiB in UTF-8, three times that escaped as ASCII (\u00e9: 6 bytes, not 2).
    count = (MAX_LINE * 8 // 10) // 100_000
    env = {f"BIG{i}": "é" * 50_000 for i in range(count)}
    assert 3 * count * 100_000 > MAX_LINE + 64 * 1024
    script = 'test "${#BIG0}" -ge 50000'  # characters or bytes, as the shell counts
    big = d.submit("sh", "-c", script, gpus=0, env=env, retries=0)
    done = d.wait_done(big)
    assert (done["state"], done["reason"]) == ("succeeded", None), done
    shown = d.show(neighbour)
    assert shown["state"] == "running" and alive(pid)
    assert [a["pid"] for a in shown["attempts"]] == [pid]
    fifo.write_text("0\n")
    finished = d.wait_done(neighbour)
    assert finished["state"] == "succeeded" and len(finished["attempts"]) == 1
    assert "interrupted" not in _kinds(finished)


def test_a_lost_connection_to_a_live_keeper_is_made_again_and_its_jobs_kept(
    make_daemon: Callable[..., Daemon],
) -> None:
    """Another `attach` closes gpusvd's connection, as a newer gpusvd's would. The keeper
    lives: gpusvd attaches again, and the job's real exit is what ends it."""
    d = make_daemon(gpus=None, config="cpu_slots = 1\n")
    fifo = d.root / "job.fifo"
    os.mkfifo(fifo)
    job = d.submit("sh", "-c", f"read code < {fifo}; exit $code", gpus=0, retries=0)
    pid = d.wait_pid(job)
    home = d.state / "keepers" / "cpu"
    keeper_pid = pid_of(home)
    with socket.socket(socket.AF_UNIX) as other:
        other.connect(str(home / "sock"))
        other.sendall(b'{"id":1,"op":"attach"}\n')
        other.settimeout(10)
        assert b'"ok":true' in other.recv(65536)
        d.wait_for(lambda: "keeper attached again" in d.log_text(), what="a new attach")
    assert pid_of(home) == keeper_pid and alive(pid)
    fifo.write_text("3\n")
    done = d.wait_done(job)
    assert (done["state"], done["exit_code"]) == ("failed", 3), done
    assert [a["reason"] for a in done["attempts"]] == ["exit_nonzero"]
    assert "interrupted" not in _kinds(done)
    again = d.submit("true", gpus=0, retries=0)  # the connection serves new spawns as well
    assert d.wait_done(again)["state"] == "succeeded"
