"""The foundation end to end: a real gpusvd, real jobs, real SQLite, real sockets."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.keeper.client import Connection

from .conftest import Daemon

PY = sys.executable

RECORD = (
    "import json, os, sys, time; t0 = time.time(); time.sleep(float(sys.argv[2])); "
    "open(sys.argv[1], 'a').write(json.dumps({'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), "
    "'order': os.environ.get('CUDA_DEVICE_ORDER'), 'job': os.environ['GPUSV_JOB_ID'], "
    "'attempt': os.environ['GPUSV_ATTEMPT'], 't0': t0, 't1': time.time()}) + '\\n')"
)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jobs_use_both_cards_never_two_on_one(daemon: Daemon) -> None:
    out = daemon.root / "rec.jsonl"
    ids = [daemon.submit(PY, "-c", RECORD, str(out), "0.4") for _ in range(6)]
    for job_id in ids:
        assert daemon.wait_done(job_id)["state"] == "succeeded"
    recs = records(out)
    assert {r["cvd"] for r in recs} == {"0", "1"}
    assert all(r["order"] == "PCI_BUS_ID" for r in recs)
    for card in ("0", "1"):
        spans = sorted((r["t0"], r["t1"]) for r in recs if r["cvd"] == card)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 0.05, f"two jobs overlapped on card {card}: {spans}"


def test_gang_job_sees_both_cards_and_cpu_job_sees_none(daemon: Daemon) -> None:
    out = daemon.root / "rec.jsonl"
    two = daemon.submit(PY, "-c", RECORD, str(out), "0", gpus=2)
    cpu = daemon.submit(PY, "-c", RECORD, str(out), "0", gpus=0)
    assert daemon.wait_done(two)["gpus"] == [0, 1]
    assert daemon.wait_done(cpu)["gpus"] == []
    by_job = {r["job"]: r for r in records(out)}
    assert by_job[str(two)]["cvd"] == "0,1"
    assert by_job[str(cpu)]["cvd"] == ""  # set and empty: the job sees no GPU


def test_cancel_kills_the_whole_tree_including_a_setsid_grandchild(any_daemon: Daemon) -> None:
    daemon = any_daemon
    pidfile = daemon.root / "grandchild.pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; sleep 300"
    job = daemon.submit("sh", "-c", script)
    daemon.wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="pidfile")
    grandchild = int(pidfile.read_text())
    leader = daemon.wait_pid(job)
    assert psutil.pid_exists(grandchild)
    result = daemon.cli("cancel", str(job))
    assert "cancelling" in result.stdout
    done = daemon.wait_done(job)
    assert done["state"] == "cancelled"
    assert done["reason"] == "cancelled"
    for pid in (grandchild, leader):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_descendants_left_behind_by_the_leader_are_killed(any_daemon: Daemon) -> None:
    daemon = any_daemon
    pidfile = daemon.root / "orphan.pid"
    job = daemon.submit("sh", "-c", f"setsid sleep 300 & echo $! > {pidfile}")
    assert daemon.wait_done(job)["state"] == "succeeded"
    orphan = int(pidfile.read_text())
    daemon.wait_for(
        lambda: not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie",
        what="the orphaned grandchild to die",
    )


def test_logs_follow_streams_until_the_job_ends(daemon: Daemon) -> None:
    script = "import time\nfor i in range(5):\n    print('line', i, flush=True); time.sleep(0.2)"
    job = daemon.submit(PY, "-c", script)
    daemon.wait_state(job, "running")
    follow = daemon.cli("logs", "--follow", str(job), timeout=30)
    assert follow.stdout.splitlines() == [f"line {i}" for i in range(5)]
    err_job = daemon.submit("sh", "-c", "echo oops >&2")
    daemon.wait_done(err_job)
    assert daemon.cli("logs", "--stderr", str(err_job)).stdout == "oops\n"


def test_missing_executable_is_spawn_failed_and_not_retried(daemon: Daemon) -> None:
    job = daemon.submit("/nonexistent/program", "--flag")
    done = daemon.wait_done(job)
    assert done["state"] == "failed"
    assert done["reason"] == "spawn_failed"
    assert len(done["attempts"]) == 1
    assert "not found" in done["attempts"][0]["evidence"]["message"]
    assert daemon.call({"type": "ping"})["ok"]

    def held_by_keepers() -> list[object]:
        held = []
        for sock in (daemon.state / "keepers").glob("*/sock"):
            with Connection(sock) as conn:
                held += [r for r in conn.call("list")["jobs"] if r["job"] == job]
        return held

    # The failed exec left a record in its keeper; the daemon let it go once the end
    # was committed (a record kept would be served to every later attach).
    deadline = time.monotonic() + 10
    while held_by_keepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held_by_keepers() == []


def test_ordinary_failures_use_their_budget_then_fail(daemon: Daemon) -> None:
    job = daemon.submit("sh", "-c", "exit 3", retries=1)
    done = daemon.wait_done(job, timeout=30)
    assert done["state"] == "failed"
    assert done["reason"] == "exit_nonzero"
    assert done["exit_code"] == 3
    assert done["retries"]["ordinary"] == {"used": 1, "budget": 1}
    assert [a["reason"] for a in done["attempts"]] == ["exit_nonzero", "exit_nonzero"]
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.count("retry_scheduled") == 1


def test_kill_9_mid_run_then_restart_takes_the_job_back_and_loses_nothing(
    any_daemon: Daemon,
) -> None:
    daemon = any_daemon
    running = daemon.submit("sleep", "300")
    leader = daemon.wait_pid(running)
    queued = [daemon.submit("sleep", "0.1", gpus=2) for _ in range(3)]
    daemon.kill9()
    assert psutil.pid_exists(leader)  # its keeper holds it, not the daemon
    daemon.start()
    job = daemon.wait_state(running, "running")
    assert [(a["n"], a["pid"], a["ended_at"]) for a in job["attempts"]] == [(1, leader, None)]
    assert not any(e["kind"] == "interrupted" for e in job["events"])
    daemon.cli("cancel", str(running))
    assert daemon.wait_done(running)["state"] == "cancelled"
    daemon.wait_for(lambda: not psutil.pid_exists(leader), what="the job killed")
    for q in queued:
        assert daemon.wait_done(q)["state"] == "succeeded"


def test_sigterm_drains_running_jobs_as_interrupted(daemon: Daemon) -> None:
    job = daemon.submit("sleep", "300")
    leader = daemon.wait_pid(job)
    assert daemon.stop(signal.SIGTERM) == 0
    assert not psutil.pid_exists(leader) or psutil.Process(leader).status() == "zombie"
    daemon.start()
    shown = daemon.show(job)
    assert shown["attempts"][0]["reason"] == "interrupted"
    assert shown["retries"]["ordinary"]["used"] == 0
    daemon.cli("cancel", str(job))


def test_bad_config_exits_2_naming_the_key(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(config="[host_memory]\nmargin = 'lots'\n", start=False)
    result = subprocess.run(d.argv(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "host_memory.margin" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    d.config.write_text("bogus_key = 1\n")
    result = subprocess.run(d.argv(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "bogus_key" in result.stderr


def test_cli_submit_wait_show_list_and_exit_codes(daemon: Daemon) -> None:
    job = daemon.cli(
        "submit", "--name", "seven", "--retries", "0", "--", "sh", "-c", "exit 7", check=False
    )
    assert job.returncode == 0 and job.stdout.strip().isdigit()
    job_id = job.stdout.strip()
    waited = daemon.cli("wait", job_id, check=False)
    assert waited.returncode == 7
    listed = json.loads(daemon.cli("list", "--json").stdout)
    assert any(str(j["id"]) == job_id and j["name"] == "seven" for j in listed)
    table = daemon.cli("list").stdout
    assert "seven" in table and "ID" in table.splitlines()[0]
    shown = json.loads(daemon.cli("show", job_id, "--json").stdout)
    assert shown["state"] == "failed" and shown["exit_code"] == 7
    waited_ok = daemon.cli("submit", "--wait", "--gpus", "0", "--", "true", check=False)
    assert waited_ok.returncode == 0
    as_json = json.loads(daemon.cli("submit", "--json", "--", "true").stdout)
    assert as_json["state"] == "queued" and as_json["argv"] == ["true"]
    missing = daemon.cli("show", "99999", check=False)
    assert missing.returncode == 1 and "no job 99999" in missing.stderr
    usage = daemon.cli("submit", "--gpus", "x", "--", "true", check=False)
    assert usage.returncode == 2
    too_many = daemon.cli("submit", "--gpus", "3", "--", "true", check=False)
    assert too_many.returncode == 1 and "has 2" in too_many.stderr


def test_dry_run_creates_nothing(daemon: Daemon) -> None:
    before = json.loads(daemon.cli("list", "--json").stdout)
    dry = json.loads(daemon.cli("submit", "--dry-run", "--mem", "2G", "--", "true").stdout)
    assert dry["id"] is None
    assert dry["host_memory"] == {
        "projected_mb": 2048,
        "basis": "declared",
        "runs": 0,
        "peak_mb": None,
    }
    assert json.loads(daemon.cli("list", "--json").stdout) == before


def test_cli_says_when_the_daemon_is_down(tmp_path: Path) -> None:
    result = subprocess.run(
        [PY, "-m", "supervisor.client.cli", "--socket", str(tmp_path / "none.sock"), "list"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 3
    assert "not running" in result.stderr and "gpusvd" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gpus_lists_simulated_cards(daemon: Daemon) -> None:
    gpus = json.loads(daemon.cli("gpus", "--json").stdout)
    assert [g["pci_bus_id"] for g in gpus] == ["0000:01:00.0", "0000:02:00.0"]
    assert all(g["health"] == "ok" and g["vram_total_mb"] == 8192 for g in gpus)
    assert all(g["name"] == "Simulated GPU" for g in gpus)


def test_no_gpu_box_runs_cpu_jobs_and_warns(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus=None)
    assert "--simulate-gpus" in d.log_text()
    job = d.submit("true", gpus=0)
    assert d.wait_done(job)["state"] == "succeeded"


@pytest.mark.root("needs root to check the socket's mode")
def test_socket_is_not_world_accessible(daemon: Daemon) -> None:
    assert daemon.socket.stat().st_mode & 0o777 == 0o660


def test_a_second_daemon_on_the_same_state_dir_is_refused(daemon: Daemon) -> None:
    job = daemon.submit("sleep", "30", gpus=0)
    daemon.wait_state(job, "running")
    argv = daemon.argv()
    argv[argv.index("--socket") + 1] = str(daemon.root / "other.sock")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "already using the state dir" in result.stderr
    assert daemon.show(job)["state"] == "running"
    daemon.cli("cancel", str(job))


def test_a_dry_run_batch_answers_every_job_in_order(daemon: Daemon) -> None:
    """Its views are made and sent a piece at a time: all of them, each in its place."""
    argvs = [["echo", str(i)] for i in range(2_345)]
    names = [f"n{i}" for i in range(2_345)]
    request = {"type": "submit_batch", "argvs": argvs, "names": names, "cwd": "/", "env": {}}
    reply = daemon.call({**request, "dry_run": True})
    assert reply["ok"] is True
    assert [j["argv"] for j in reply["jobs"]] == argvs
    assert [j["name"] for j in reply["jobs"]] == names
    assert {j["id"] for j in reply["jobs"]} == {None}
    assert daemon.call({"type": "list"})["jobs"] == []
