"""gpusvd killed at random instants of a burst of starts: a restarted daemon takes back
what was started and starts what was not, and never has two attempts of one job alive.

The oracle is the processes themselves: every job process carries its job id and attempt
in its environment, so the test counts, from /proc, the attempts of each job that live."""

from __future__ import annotations

import collections
import os
import random
import time
from collections.abc import Callable

import psutil
import pytest

from .conftest import Daemon

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]

TRIALS = 20
BURST = 60


def _live_attempts(d: Daemon) -> dict[int, set[int]]:
    """Job id -> the attempts of it that have a live (not zombie) process."""
    out: dict[int, set[int]] = collections.defaultdict(set)
    for proc in psutil.process_iter(["environ", "status"]):
        try:
            env = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if env.get("GPUSV_TEST_ROOT") != str(d.root) or "GPUSV_JOB_ID" not in env:
            continue
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        out[int(env["GPUSV_JOB_ID"])].add(int(env["GPUSV_ATTEMPT"]))
    return out


def _running_with_pids(d: Daemon, ids: list[int]) -> dict[int, tuple[int, int]] | None:
    """Job id -> (attempt, pid) once every job of the burst runs with its pid recorded."""
    jobs = {j["id"]: j for j in d.call({"type": "list", "limit": 10_000})["jobs"]}
    if any(jobs[i]["state"] != "running" for i in ids):
        return None
    out = {}
    for i in ids:
        attempts = d.show(i)["attempts"]
        if not attempts or attempts[-1]["pid"] is None:
            return None
        out[i] = (attempts[-1]["n"], attempts[-1]["pid"])
    return out


@pytest.mark.timeout(900)  # 1,200 starts and 20 restarts: a minute idle, several under load
def test_a_kill_9_at_any_instant_of_a_burst_never_runs_an_attempt_twice(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G", config=f"cpu_slots = {BURST}\n")
    seed = random.randrange(2**32)
    print(f"kill instants from random.Random({seed})")
    rng = random.Random(seed)
    cwd, env = str(d.root), {"PATH": os.environ["PATH"], "GPUSV_TEST_ROOT": str(d.root)}
    interrupted = 0
    for trial in range(TRIALS):
        reply = d.call(
            {
                "type": "submit_batch",
                "argvs": [["sleep", "1000"]] * BURST,
                "cwd": cwd,
                "env": env,
                "gpus": 0,
            }
        )
        ids = [int(i) for i in reply["ids"]]
        time.sleep(rng.uniform(0.0, 0.8))  # the instant of the kill, not a wait
        d.kill9()
        d.start()

        def running_again(ids: list[int] = ids) -> dict[int, tuple[int, int]] | None:
            return _running_with_pids(d, ids)

        running = d.wait_for(
            running_again,
            timeout=60,
            what=f"trial {trial}: the burst running again",
        )
        live = _live_attempts(d)
        for job_id, (n, pid) in running.items():
            assert live[job_id] == {n}, f"trial {trial}: job {job_id} has attempts {live[job_id]}"
            assert psutil.Process(pid).environ()["GPUSV_JOB_ID"] == str(job_id)
            interrupted += n > 1
        d.cli("cancel", "--all")
        for job_id in ids:
            assert d.wait_done(job_id, timeout=60)["state"] == "cancelled"

        def gone(ids: list[int] = ids) -> bool:
            return not set(ids) & set(_live_attempts(d))

        d.wait_for(gone, what="the burst gone")
    # How many starts the kills caught before their process was recorded: informative.
    print(f"{TRIALS} trials of {BURST}: {interrupted} jobs needed a second attempt")
