"""`systemctl restart` (and SIGQUIT) replace the daemon and keep the jobs; `systemctl
stop` drains them. systemd is not PID 1 here, so a stand-in `systemctl` answers
`list-jobs` as systemd would during each; the daemon, keepers and jobs are real."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Daemon

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]


def _under_systemd(root: Path, job: str) -> dict[str, str]:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"#!/bin/sh\necho ' 12 gpusvd.service {job} running'\n")
    systemctl.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "INVOCATION_ID": "0" * 32}


@pytest.mark.parametrize(
    ("job", "sig"), [("restart", signal.SIGTERM), (None, signal.SIGQUIT)], ids=["restart", "quit"]
)
def test_a_restart_keeps_running_jobs_and_the_next_daemon_takes_them_back(
    make_daemon: Callable[..., Daemon], tmp_path: Path, job: str | None, sig: int
) -> None:
    env = _under_systemd(tmp_path, job) if job else {}
    d = make_daemon(env=env)
    fifo = d.root / "fifo"
    os.mkfifo(fifo)
    job_id = d.submit("sh", "-c", f"read c < {fifo}; exit $c")
    pid = d.wait_pid(job_id)
    assert d.stop(sig) == 0
    assert "leaving: running jobs stay with their keepers" in d.log_text()
    os.kill(pid, 0)  # still running
    d.start()
    shown = d.wait_state(job_id, "running")
    assert [(a["n"], a["pid"]) for a in shown["attempts"]] == [(1, pid)]
    fifo.write_text("0\n")
    done = d.wait_done(job_id)
    assert done["state"] == "succeeded" and len(done["attempts"]) == 1


def test_a_stop_drains_running_jobs(make_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    d = make_daemon(env=_under_systemd(tmp_path, "stop"))
    job_id = d.submit("sleep", "1000")
    d.wait_pid(job_id)
    assert d.stop(signal.SIGTERM) == 0
    assert "drained" in d.log_text()
    d.start()
    shown = d.show(job_id)
    assert shown["attempts"][0]["reason"] == "interrupted"
    assert shown["retries"]["ordinary"]["used"] == 0


def test_a_stop_leaves_no_cgroup_of_its_keepers_behind(make_daemon: Callable[..., Daemon]) -> None:
    """Where no systemd trims the unit's tree after a stop (a shell, a container), the
    keepers let go by the drain remove their roots, and the daemon then its group."""
    from supervisor.daemon.cgroups import keeper_roots
    from supervisor.daemon.running.keepers import cgroup_tag

    d = make_daemon(gpus="1x8G", config="cpu_slots = 1\n")
    bases = [b for b in keeper_roots(cgroup_tag(d.state)) if b is not None]
    assert bases, "no cgroup hierarchy to make keeper roots in"
    cpu_job, gpu_job = d.submit("sleep", "1000", gpus=0), d.submit("sleep", "1000")
    d.wait_pid(cpu_job)
    d.wait_pid(gpu_job)
    made = sorted(p.name for p in bases[0].iterdir() if p.is_dir())
    assert made == ["keeper-cpu", "keeper-gpu0"]
    assert d.stop(signal.SIGTERM) == 0
    assert "drained" in d.log_text()
    assert [b for b in bases if b.exists()] == []


def test_a_stop_leaves_a_group_that_holds_something_else_in_place_and_says_so(
    make_daemon: Callable[..., Daemon],
) -> None:
    from supervisor.daemon.cgroups import keeper_roots
    from supervisor.daemon.running.keepers import cgroup_tag

    d = make_daemon(gpus="1x8G")
    v2 = keeper_roots(cgroup_tag(d.state))[0]
    assert v2 is not None, "no unified hierarchy to make keeper roots in"
    d.wait_done(d.submit("true"))
    other = v2 / "keeper-gpu0" / "made-by-someone-else"
    other.mkdir()
    try:
        assert d.stop(signal.SIGTERM) == 0
        assert [p.name for p in (v2 / "keeper-gpu0").iterdir() if p.is_dir()] == [other.name]
        assert "cgroup left in place" in d.log_text()
        keeper_log = (d.state / "keepers" / "gpu0" / "log").read_text()
        assert "cgroup roots left in place" in keeper_log
        assert "no jobs left to keep: exiting" in keeper_log
    finally:
        other.rmdir()
