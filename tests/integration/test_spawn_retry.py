"""A start that fails for a passing cause is retried, on the ordinary budget, with a real
daemon and keeper: the job's cgroup of attempt 1 is found still holding a process (a
start whose keeper died before its command could run), so the keeper kills what is in
it and refuses the start as passing; attempt 2 runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.daemon.cgroups import keeper_roots
from supervisor.daemon.running.keepers import cgroup_tag

from .conftest import Daemon

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="job cgroups need root"),
]


def test_a_passing_start_failure_is_retried_and_the_next_attempt_runs(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None, config="cpu_slots = 1\n")
    assert d.proc is not None
    v2, _ = keeper_roots(cgroup_tag(d.state), proc_cgroup=Path(f"/proc/{d.proc.pid}/cgroup"))
    if v2 is None:
        pytest.skip("the daemon has no cgroup2 root for its keepers here")
    first = d.submit("true", gpus=0)
    assert d.wait_done(first)["state"] == "succeeded"  # the CPU keeper runs, its roots made
    busy = v2 / "keeper-cpu" / f"job-{first + 1}-1"
    busy.mkdir()
    stray = subprocess.Popen(["sh", "-c", f"echo $$ > {busy}/cgroup.procs && exec sleep 300"])
    try:
        d.wait_for(lambda: (busy / "cgroup.procs").read_text().split(), what="the stray in")
        job = d.submit("true", gpus=0, retries=1)
        assert job == first + 1
        done = d.wait_done(job)
        assert stray.wait(timeout=30) != 0  # killed by the keeper, not waited for
    finally:
        stray.kill()
        stray.wait()
    assert done["state"] == "succeeded", done
    assert [a["reason"] for a in done["attempts"]] == ["spawn_retry", None]
    assert done["retries"]["ordinary"]["used"] == 1
    kinds = [e["kind"] for e in done["events"]]
    assert "retry_scheduled" in kinds and "interrupted" not in kinds
