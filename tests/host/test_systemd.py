"""gpusvd installed as an operator would, under a real systemd as PID 1: start, restarts
of every kind with jobs and attached clients, stop, the journal."""

from __future__ import annotations

import json
import re

from .conftest import UNIT, Gpusvd

XID_109_CARD0 = (
    "[10900.272611] NVRM: Xid (PCI:0000:01:00): 109, pid=11263, name=Renderer, "
    "Ch 00000020, errorString CTX SWITCH TIMEOUT, Info 0xac00d"
)
DEADMAN_EXIT = "13f0368a14c2483d80583ee63f982d8d"  # supervisor/daemon/life/journal.py


def waiter(name: str, code: int) -> str:
    """A job's script: runs until /tmp/go-NAME exists, then exits `code`."""
    return f"while [ ! -e /tmp/go-{name} ]; do sleep 0.1; done; exit {code}"


def go(gpusvd: Gpusvd, *names: str) -> None:
    gpusvd.m.sh(" ".join(f"touch /tmp/go-{n};" for n in names))


def job_cgroup(gpusvd: Gpusvd, job: int, pid: int) -> str:
    """The job's unified cgroup, asserted to be its own (job-ID-ATTEMPT), never gpusvd's."""
    line = next(line for line in gpusvd.cgroup_of(pid).splitlines() if line.startswith("0::"))
    path = line[3:]
    assert re.search(rf"/job-{job}-\d+$", path), f"job {job} runs in {path}"
    return path


def leftover_lines(gpusvd: Gpusvd) -> list[str]:
    return [line for line in gpusvd.journal().splitlines() if "left-over process" in line]


def test_start_is_ready_with_a_status(gpusvd: Gpusvd) -> None:
    gpusvd.start()  # Type=notify: `start` returns once READY=1 arrived
    props = gpusvd.m.show(UNIT, "ActiveState", "SubState", "StatusText", "Result")
    assert props["ActiveState"] == "active" and props["SubState"] == "running"
    assert props["StatusText"], props
    assert gpusvd.cli("health").returncode == 0


def test_restart_takes_back_jobs_and_attached_clients_end_with_the_jobs_codes(
    gpusvd: Gpusvd,
) -> None:
    gpusvd.start()
    jobs = {"a": gpusvd.submit("sh", "-c", waiter("a", 0), gpus=1)}
    jobs["cpu"] = gpusvd.submit("sh", "-c", waiter("cpu", 0), gpus=0)
    client = gpusvd.m.popen(
        f"gpusv run --gpus 1 --retries 0 -- sh -c 'echo before; {waiter('run', 7)}'"
    )
    gpusvd.m.wait_for(
        lambda: len(json.loads(gpusvd.cli("list", "--json").stdout)) == 3, "the run's job"
    )
    jobs["run"] = max(j["id"] for j in json.loads(gpusvd.cli("list", "--json").stdout))
    pids = {name: gpusvd.wait_pid(job) for name, job in jobs.items()}
    old = gpusvd.main_pid()
    gpusvd.m.sh(f"systemctl restart {UNIT}", timeout=120)
    gpusvd.wait_active(other_than=old)
    for name, job in jobs.items():
        shown = gpusvd.show(job)
        assert shown["state"] == "running", shown
        assert [(a["n"], a["pid"]) for a in shown["attempts"]] == [(1, pids[name])]
        job_cgroup(gpusvd, job, pids[name])
    go(gpusvd, "a", "cpu", "run")
    out, err = client.communicate(timeout=120)
    assert client.returncode == 7, (out, err)
    assert out.count("before") == 1, out
    for name in ("a", "cpu"):
        assert gpusvd.wait_state(jobs[name], "succeeded")["attempts"][0]["pid"] == pids[name]
    assert leftover_lines(gpusvd) == []


def test_stop_drains_and_leaves_no_keeper_job_or_cgroup(gpusvd: Gpusvd) -> None:
    gpusvd.start()
    job = gpusvd.submit("sh", "-c", waiter("never", 0), gpus=1)
    pid = gpusvd.wait_pid(job)
    cgroup = gpusvd.m.show(UNIT, "ControlGroup")["ControlGroup"]
    gpusvd.m.sh(f"systemctl stop {UNIT}", timeout=150)
    assert gpusvd.m.sh(f"kill -0 {pid}", check=False).returncode != 0
    assert gpusvd.m.sh("pgrep -f 'supervisor[.]keeper'", check=False).stdout == ""
    assert not gpusvd.m.path(f"/sys/fs/cgroup{cgroup}").exists()
    scopes = gpusvd.m.sh("systemctl list-units --plain --no-legend 'gpusv-*'").stdout
    assert scopes.strip() == ""
    assert gpusvd.m.sh("ls /sys/fs/cgroup/system.slice").stdout.count("gpusv") == 0


def test_the_journal_has_a_jobs_story_by_its_field(gpusvd: Gpusvd) -> None:
    gpusvd.start()
    job = gpusvd.submit("sh", "-c", "exit 3", gpus=0, extra=("--retries", "0"))
    gpusvd.wait_state(job, "failed", "succeeded")
    entries = [
        json.loads(line) for line in gpusvd.journal(f"GPUSV_JOB={job}", "-o json").splitlines()
    ]
    assert entries, "no journal entry with GPUSV_JOB"
    assert all(e["GPUSV_JOB"] == str(job) for e in entries)
    assert any("GPUSV_EVENT" in e for e in entries), entries
    assert {e.get("SYSLOG_IDENTIFIER") for e in entries} == {"gpusvd"}


def test_deadman_exits_70_systemd_restarts_it_and_the_other_cards_job_runs_on(
    gpusvd: Gpusvd,
) -> None:
    gpusvd.configure("[deadman]\nabort_deadline_s = 3\n", dropin="[Service]\nRestartSec=1\n")
    gpusvd.start()
    wedged = gpusvd.submit("sh", "-c", "sleep 300", gpus=1)
    gpusvd.wait_pid(wedged)
    assert gpusvd.show(wedged)["gpus"] == [0]
    healthy = gpusvd.submit("sh", "-c", waiter("healthy", 4), gpus=1, extra=("--retries", "0"))
    pid = gpusvd.wait_pid(healthy)
    old = gpusvd.main_pid()
    gpusvd.wedge(0, True)
    gpusvd.kernel_line(XID_109_CARD0)
    gpusvd.m.wait_for(lambda: "status=70" in gpusvd.journal(), "gpusvd to exit 70", 90)
    gpusvd.wedge(0, False)
    gpusvd.wait_active(other_than=old, timeout_s=90)
    assert int(gpusvd.m.show(UNIT, "NRestarts")["NRestarts"]) >= 1
    entries = [json.loads(line) for line in gpusvd.journal("-o json").splitlines()]
    deadman = [e for e in entries if e.get("MESSAGE_ID") == DEADMAN_EXIT]
    assert len(deadman) == 1 and deadman[0]["PRIORITY"] == "2", deadman
    shown = gpusvd.show(healthy)
    assert shown["state"] == "running" and shown["attempts"][0]["pid"] == pid
    job_cgroup(gpusvd, healthy, pid)
    go(gpusvd, "healthy")
    done = gpusvd.wait_state(healthy, "failed")
    assert done["exit_code"] == 4 and len(done["attempts"]) == 1
    assert leftover_lines(gpusvd) == []


def test_the_watchdog_restarts_a_stopped_gpusvd_and_its_jobs_are_taken_back(
    gpusvd: Gpusvd,
) -> None:
    gpusvd.configure(dropin="[Service]\nWatchdogSec=4\nRestartSec=1\n")
    gpusvd.start()
    job = gpusvd.submit("sh", "-c", waiter("wd", 0), gpus=1)
    pid = gpusvd.wait_pid(job)
    old = gpusvd.main_pid()
    gpusvd.m.sh(f"kill -STOP {old}")
    gpusvd.wait_active(other_than=old, timeout_s=60)
    assert "Watchdog timeout" in gpusvd.journal()
    shown = gpusvd.show(job)
    assert shown["state"] == "running" and shown["attempts"][0]["pid"] == pid
    job_cgroup(gpusvd, job, pid)
    go(gpusvd, "wd")
    assert gpusvd.wait_state(job, "succeeded")["attempts"][0]["pid"] == pid
    assert leftover_lines(gpusvd) == []


def test_repeated_crashes_hit_the_start_limit_and_jobs_run_on(gpusvd: Gpusvd) -> None:
    gpusvd.configure(dropin="[Service]\nRestartSec=0\n")
    gpusvd.start()
    job = gpusvd.submit("sh", "-c", waiter("limit", 0), gpus=0)
    pid = gpusvd.wait_pid(job)
    for _ in range(4):  # StartLimitBurst=4: the first start and three restarts
        old = gpusvd.wait_active()
        gpusvd.m.sh(f"kill -9 {old}")
        gpusvd.m.wait_for(
            lambda old=old: gpusvd.main_pid() != old,  # type: ignore[misc]
            "the crash to be seen",
        )
    gpusvd.m.wait_for(
        lambda: "Start request repeated too quickly" in gpusvd.journal(), "the start limit"
    )
    gpusvd.m.wait_for(
        lambda: gpusvd.m.show(UNIT, "ActiveState")["ActiveState"] == "failed", "failed"
    )
    assert gpusvd.m.sh(f"kill -0 {pid}", check=False).returncode == 0  # the job lives
    gpusvd.m.sh(f"systemctl reset-failed {UNIT} && systemctl start {UNIT}", timeout=120)
    assert gpusvd.show(job)["attempts"][0]["pid"] == pid
    go(gpusvd, "limit")
    gpusvd.wait_state(job, "succeeded")


def test_an_acknowledged_cancel_survives_a_kill_9_in_the_kill_grace(gpusvd: Gpusvd) -> None:
    gpusvd.configure("[jobs]\nkill_grace_s = 6\n", dropin="[Service]\nRestartSec=1\n")
    gpusvd.start()
    stubborn = "trap '' TERM; echo x > /tmp/ran-$GPUSV_ATTEMPT; while :; do sleep 0.2; done"
    job = gpusvd.submit("sh", "-c", stubborn, gpus=1)
    pid = gpusvd.wait_pid(job)
    gpusvd.cli("cancel", str(job))
    old = gpusvd.main_pid()
    gpusvd.m.sh(f"kill -9 {old}")
    gpusvd.wait_active(other_than=old)
    done = gpusvd.wait_state(job, "cancelled", "failed", "succeeded", timeout_s=60)
    assert done["state"] == "cancelled", done
    assert [a["pid"] for a in done["attempts"]] == [pid]
    assert gpusvd.m.sh("ls /tmp/ran-*").stdout.split() == ["/tmp/ran-1"]
    assert gpusvd.m.sh(f"kill -0 {pid}", check=False).returncode != 0
