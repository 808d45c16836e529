"""A client killed at random instants of a burst of spawns: the next client never ends up
with two attempts of one job alive, whatever the first one's socket still held."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from .keeper_fixture import Keeper, keeper

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]

JOBS = 20
TRIALS = 5


def _burst(k: Keeper, base: int) -> subprocess.Popen[bytes]:
    """A client that sends JOBS spawns a few milliseconds apart, answers unread, so that
    its death falls among them."""
    specs = [k.job(base + j, ["sleep", "1000"]) for j in range(JOBS)]
    code = (
        "import sys, time; from pathlib import Path\n"
        "from supervisor.keeper.client import Connection\n"
        f"c = Connection(Path('{k.home}/sock')); c.call('attach')\n"
        "print('attached', flush=True)\n"
        f"for spec in {specs!r}:\n"
        "    c.send('spawn', **spec)\n"
        "    time.sleep(0.002)\n"
        "time.sleep(1000)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def _alive_in(k: Keeper, job: int, attempt: int) -> bool:
    assert k.v2 is not None
    procs = k.v2 / f"job-{job}-{attempt}" / "cgroup.procs"
    try:
        return procs.read_text().strip() != ""
    except FileNotFoundError:
        return False


def test_a_kill_at_any_instant_of_a_burst_never_runs_an_attempt_twice() -> None:
    with keeper() as k:
        assert k.v2 is not None, "no unified cgroup hierarchy"
        rng = random.Random(os.getpid())
        for trial in range(TRIALS):
            base = 1000 * (trial + 1)
            client = _burst(k, base)
            assert client.stdout is not None and client.stdout.readline() == b"attached\n"
            time.sleep(rng.uniform(0, 0.06))  # the instant of the kill, not a wait
            client.send_signal(signal.SIGKILL)
            client.wait()
            conn = k.connect()  # as a new daemon: attach, list, then start what is missing
            known = {j["job"] for j in conn.call("list")["jobs"]}
            missing = [base + j for j in range(JOBS) if base + j not in known]
            for job in missing:
                conn.call("spawn", **k.job(job, ["sleep", "1000"], attempt=2))
            for j in range(JOBS):
                both = _alive_in(k, base + j, 1) and _alive_in(k, base + j, 2)
                assert not both, f"trial {trial}: job {base + j} runs twice"
            for record in conn.call("list")["jobs"]:
                conn.call("kill", job=record["job"], attempt=record["attempt"], grace_s=0)
                conn.call("ack", job=record["job"], attempt=record["attempt"])
            assert conn.call("list")["jobs"] == []
            conn.close()
