"""The everyday verbs through the real CLI against a real gpusvd: run, wait's exit
codes, restart, hold/release, pause/resume, clean, cancel --all, list filters, logs,
wall-time limits, batches and pipes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .conftest import Daemon


def cli_json(d: Daemon, *args: str) -> Any:
    return json.loads(d.cli(*args, "--json").stdout)


def submit(d: Daemon, *args: str) -> int:
    return int(d.cli("submit", *args).stdout.strip())


def run_client(d: Daemon, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor.client.cli", "--socket", str(d.socket), "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=d.env,
        cwd=d.root,
    )


def test_run_streams_output_and_exits_with_the_jobs_status(daemon: Daemon) -> None:
    d = daemon
    argv = ["run", "--gpus", "0", "--retries", "0", "--", "sh", "-c"]
    done = d.cli(*argv, "echo out; echo err >&2; exit 7", check=False)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    killed = d.cli(*argv, "kill -9 $$", check=False)
    assert killed.returncode == 128 + 9
    ok = d.cli("run", "--", "sh", "-c", 'echo "gpu $CUDA_VISIBLE_DEVICES"')
    assert ok.returncode == 0 and ok.stdout in ("gpu 0\n", "gpu 1\n")


def test_a_killed_run_client_cancels_its_job(daemon: Daemon) -> None:
    d = daemon
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        client = run_client(d, "--gpus", "0", "--name", f"tied-{sig}", "--", "sleep", "300")

        def running(sig: signal.Signals = sig) -> list[Any]:
            return [
                j
                for j in cli_json(d, "list")
                if j["name"] == f"tied-{sig}" and j["state"] == "running"
            ]

        job = d.wait_for(running, what="the run job running")[0]
        client.send_signal(sig)
        code = client.wait(20)
        if sig != signal.SIGKILL:
            assert code == 128 + sig, client.stderr.read() if client.stderr else ""
        assert d.wait_done(job["id"])["state"] == "cancelled"
        client.stdout and client.stdout.close()
        client.stderr and client.stderr.close()


def test_wait_exit_codes_tell_the_job_from_gpusv(daemon: Daemon) -> None:
    d = daemon
    three = submit(d, "--gpus", "0", "--retries", "0", "--", "sh", "-c", "exit 3")
    assert d.cli("wait", str(three), check=False).returncode == 3
    sleeper = submit(d, "--gpus", "0", "--", "sleep", "300")
    d.wait_state(sleeper, "running")
    timed_out = d.cli("wait", str(sleeper), "--timeout", "1s", check=False)
    assert timed_out.returncode == 124 and "timed out" in timed_out.stderr
    d.cli("pause")
    queued = submit(d, "--gpus", "0", "--", "true")
    child = submit(d, "--gpus", "0", "--after", str(three), "--", "true")
    d.cli("cancel", str(queued))
    assert d.cli("wait", str(queued), check=False).returncode == 125
    assert d.cli("wait", str(child), check=False).returncode == 125  # dependency_failed
    assert d.cli("wait", "999", check=False).returncode == 1
    d.cli("resume")
    d.cli("cancel", str(sleeper))
    waited = json.loads(d.cli("wait", str(sleeper), "--json", check=False).stdout)
    assert waited["timed_out"] is False and waited["jobs"][0]["state"] == "cancelled"


def test_pause_hold_release_and_resume(daemon: Daemon) -> None:
    d = daemon
    assert d.cli("pause").stdout.startswith("paused")
    assert cli_json(d, "health")["paused"] is True
    assert "queue paused" in d.cli("health").stdout
    assert "paused" in d.cli("top", "--once").stdout.lower()
    first = submit(d, "--gpus", "0", "--", "true")
    assert d.cli("wait", str(first), "--timeout", "1", check=False).returncode == 124
    (row,) = [r for r in d.cli("list").stdout.splitlines() if r.split()[0] == str(first)]
    assert row.split()[1] == "queued" and row.rstrip().endswith("paused")
    assert "the queue is paused" in d.cli("show", str(first)).stdout.splitlines()[1]
    held = submit(d, "--gpus", "0", "--", "true")
    assert d.cli("hold", str(held)).stdout == f"{held} held\n"
    again = d.cli("hold", str(held), check=False)
    assert again.returncode == 1 and "already held" in again.stderr
    d.cli("resume")
    assert d.cli("wait", str(first)).returncode == 0
    later = submit(d, "--gpus", "0", "--", "true")
    assert d.cli("wait", str(later)).returncode == 0
    shown = d.show(held)
    assert shown["state"] == "queued" and shown["held"] is True
    assert "held" in d.cli("show", str(held)).stdout
    d.cli("release", str(held))
    assert d.cli("wait", str(held)).returncode == 0
    kinds = [e["kind"] for e in d.show(held)["events"]]
    assert "held" in kinds and "released" in kinds
    done = d.cli("hold", str(held), check=False)
    assert done.returncode == 1 and "only a queued job" in done.stderr


def test_restart_clean_and_cancel_all(daemon: Daemon) -> None:
    d = daemon
    job = submit(d, "--gpus", "0", "--name", "again", "--", "sh", "-c", "echo run")
    d.cli("wait", str(job))
    new = int(d.cli("restart", str(job)).stdout)
    assert new > job
    assert d.cli("wait", str(new)).returncode == 0
    spec = d.show(new)
    assert spec["argv"] == ["sh", "-c", "echo run"] and spec["name"] == "again"
    assert d.cli("logs", str(new)).stdout == "run\n"
    busy = [submit(d, "--gpus", "0", "--", "sleep", "300") for _ in range(2)]
    busy.append(submit(d, "--gpus", "2", "--", "sleep", "300"))
    restart_active = d.cli("restart", str(busy[0]), check=False)
    assert restart_active.returncode == 1 and "still" in restart_active.stderr
    d.wait_state(busy[0], "running")
    results = cli_json(d, "cancel", "--all")
    assert sorted(r["id"] for r in results) == sorted(busy) and all(r["ok"] for r in results)
    for b in busy:
        assert d.wait_done(b)["state"] == "cancelled"
    assert d.cli("clean", "--older-than", "1h").stdout.startswith("removed 0 jobs")
    assert (d.state / "logs" / f"{job}.out").exists()
    cleaned = cli_json(d, "clean")
    assert sorted(cleaned["removed"]) == sorted([job, new, *busy])
    assert not (d.state / "logs" / f"{job}.out").exists()
    assert cli_json(d, "list", "--all") == []
    assert d.cli("cancel", check=False).returncode == 2


def test_list_filters_and_logs(daemon: Daemon) -> None:
    d = daemon
    big = submit(d, "--gpus", "0", "--", "python3", "-c", "print('x' * 1999999)")
    d.cli("wait", str(big))
    assert len(d.cli("logs", str(big)).stdout) == 2_000_000  # all of it, past 512 KiB
    lines = submit(d, "--gpus", "0", "--", "sh", "-c", "for i in 1 2 3 4 5; do echo $i; done")
    d.cli("wait", str(lines))
    assert d.cli("logs", str(lines), "--tail", "2").stdout == "4\n5\n"
    ids = {j["id"] for j in cli_json(d, "list", "--mine")}
    assert ids == {big, lines} == {j["id"] for j in cli_json(d, "list", "--user", "root")}
    assert cli_json(d, "list", "--user", "nobody") == []
    assert d.cli("list", "--user", "no-such-user-x", check=False).returncode == 2
    table = d.cli("list").stdout.splitlines()
    header = ["ID", "STATE", "USER", "GPUS", "CARDS", "EXIT", "TIME", "AGE", "NAME/COMMAND"]
    assert table[0].split() == [*header, "NOTE"]
    # a CPU-only job: asked for 0 cards, held none, exited 0
    done = [str(lines), "succeeded", "root", "0", "-", "0"]
    assert any(line.split()[:6] == done for line in table)
    named = submit(d, "--gpus", "0", "--name", "enc-a", "--label", "kind=enc", "--", "true")
    other = submit(d, "--gpus", "0", "--name", "train", "--label", "kind=fit", "--", "true")
    assert [j["id"] for j in cli_json(d, "list", "--name", "enc-*")] == [named]
    assert [j["id"] for j in cli_json(d, "list", "--label", "kind=fit")] == [other]
    assert cli_json(d, "list", "--name", "enc-*", "--label", "kind=fit") == []
    typo = d.cli("list", "--state", "runing", check=False)
    assert typo.returncode == 2 and "did you mean 'running'?" in typo.stderr
    assert typo.stderr.startswith("usage: gpusv list ")
    env = submit(d, "--gpus", "0", "--", "sh", "-c", 'echo "$PYTHONUNBUFFERED"')
    d.cli("wait", str(env))
    assert d.cli("logs", str(env)).stdout == "1\n"
    stats = cli_json(d, "stats")
    assert stats["logs"]["files"] >= 6 and stats["logs"]["disk_mb"] >= 1
    assert "job logs:" in d.cli("stats").stdout


def test_attempts_are_marked_in_the_log_and_time_limits_are_final(daemon: Daemon) -> None:
    d = daemon
    retried = submit(d, "--gpus", "0", "--retries", "1", "--", "sh", "-c", "echo try; exit 1")
    assert d.cli("wait", str(retried), check=False).returncode == 1
    log = d.cli("logs", str(retried)).stdout
    assert log.startswith("try\n") and log.count("try\n") == 2
    assert f"--- gpusv: job {retried}, attempt 2, started " in log
    slow = submit(d, "--gpus", "0", "--time", "1s", "--retries", "5", "--", "sleep", "300")
    assert d.cli("wait", str(slow), check=False).returncode == 128 + signal.SIGTERM
    job = d.show(slow)
    assert (job["state"], job["reason"], len(job["attempts"])) == ("failed", "timeout", 1)
    assert job["time_limit_s"] == 1.0
    assert any("wall-time limit" in e["message"] for e in job["events"])
    assert "time limit   1s" in d.cli("show", str(slow)).stdout
    bad = d.cli("submit", "--time", "soon", "--", "true", check=False)
    assert bad.returncode == 2 and "--time: must be a duration" in bad.stderr


def test_batches_keep_words_as_a_shell_does(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    batch = tmp_path / "renders.txt"
    batch.write_text(
        "# frames\nblender -b scene.blend -o out/frame_#### -f 5\necho 'a  b' \"#c\" # note\n"
    )
    d.cli("pause")
    reply = cli_json(d, "submit", "--gpus", "0", "--batch", str(batch))
    assert list(reply) == ["ids"] and len(reply["ids"]) == 2
    first, second = (d.show(i) for i in reply["ids"])
    assert first["argv"] == ["blender", "-b", "scene.blend", "-o", "out/frame_####", "-f", "5"]
    assert second["argv"] == ["echo", "a  b", "#c"]
    assert (first["name"], second["name"]) == ("renders.txt:2", "renders.txt:3")
    dry = json.loads(d.cli("submit", "--dry-run", "--batch", "-", input="true\n").stdout)
    assert isinstance(dry, list) and dry[0]["argv"] == ["true"]
    named = d.cli("submit", "--gpus", "0", "--name", "sweep", "--batch", "-", input="true\ntrue\n")
    assert [d.show(int(i))["name"] for i in named.stdout.split()] == ["sweep:1", "sweep:2"]
    parent_ok = submit(d, "--gpus", "0", "--", "true")
    parent_bad = submit(d, "--gpus", "0", "--retries", "0", "--", "false")
    child = submit(
        d, "--gpus", "0", "--after", str(parent_ok), "--after", str(parent_bad), "--", "true"
    )
    assert d.show(child)["after"] == [parent_ok, parent_bad]
    d.cli("resume")
    assert d.wait_done(child)["reason"] == "dependency_failed"


def test_a_batch_over_one_request_is_refused_by_the_client_with_what_to_do(
    daemon: Daemon,
) -> None:
    """The documented 100,000 commands, with their names, are more than the 1 MiB one
    request may be: the client says so, and how to split it, and sends nothing."""
    d = daemon
    d.cli("pause")
    lines = "".join(f"echo {i}\n" for i in range(100_000))
    big = d.cli("submit", "--gpus", "0", "--batch", "-", input=lines, check=False)
    assert big.returncode == 2, big.stderr
    assert "100000 commands make a request of" in big.stderr and "1 MiB" in big.stderr
    fits = int(big.stderr.split("parts of about ")[1].split()[0])
    assert 30_000 < fits < 100_000
    assert d.call({"type": "list"})["jobs"] == []
    part = "".join(f"echo {i}\n" for i in range(fits))
    ids = d.cli("submit", "--gpus", "0", "--batch", "-", input=part).stdout.split()
    assert len(ids) == fits


def test_pipes_into_head_end_quietly(daemon: Daemon) -> None:
    d = daemon
    job = submit(d, "--gpus", "0", "--", "python3", "-c", "print('y\\n' * 400000)")
    d.cli("wait", str(job))
    d.cli("pause")  # a long list: these stay queued
    d.cli("submit", "--gpus", "0", "--batch", "-", input="true\n" * 3000)
    gpusv = f"{sys.executable} -m supervisor.client.cli --socket {d.socket}"
    for command in ("list --all", f"show {job}", f"logs {job}", "list --all --json"):
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {gpusv} {command} | head -1"],
            capture_output=True,
            text=True,
            env=d.env,
            timeout=120,
        )
        assert (done.returncode, done.stderr) == (0, ""), command


def test_words_for_people(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus=None)
    refused = d.cli("submit", "--", "true", check=False)
    assert refused.returncode == 1 and "--gpus 0" in refused.stderr
    too_many = d.cli("submit", "--gpus", "100", "--", "true", check=False)
    assert "--gpus" in too_many.stderr and "field" not in too_many.stderr
    assert "oom_score_adj" not in "".join(
        line for line in d.log_text().splitlines() if "warning" in line
    )
    version = d.cli("--version")
    assert version.stdout.startswith("gpusv ")
    daemon_version = subprocess.run(
        [sys.executable, "-m", "supervisor.daemon.life.app", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert daemon_version.stdout.startswith("gpusvd ")
    assert d.cli("completion", "bash").stdout.startswith("# bash completion for gpusv")


def test_classify_faults_only(tmp_path: Path) -> None:
    benign = "kernel: usb 1-1: new high-speed USB device number 2 using xhci_hcd"
    hang = "NVRM: Xid (PCI:0000:01:00): 109, pid=1, name=x, Ch 00000008, errorString CTX SWITCH"
    log = tmp_path / "kern.log"
    argv = [sys.executable, "-m", "supervisor.client.cli", "classify-kernel-log", "--faults-only"]
    log.write_text(f"{benign}\n{hang}\n")
    found = subprocess.run([*argv, str(log)], capture_output=True, text=True, timeout=30)
    assert found.returncode == 1 and found.stdout.count("\n") == 1 and "gpu_hang" in found.stdout
    log.write_text(f"{benign}\n")
    clean = subprocess.run([*argv, str(log)], capture_output=True, text=True, timeout=30)
    assert (clean.returncode, clean.stdout) == (0, "")
    assert os.path.exists(log)


def test_wait_for_many_jobs_answers_each_in_the_order_asked(daemon: Daemon) -> None:
    """More ids than one read of the store takes (500): those ended already, one still
    running, and the answer in the order the ids were given."""
    d = daemon
    batch = d.cli("submit", "--gpus", "0", "--batch", "-", input="true\n" * 620)
    ids = [int(i) for i in batch.stdout.split()]
    assert d.call({"type": "wait", "ids": ids, "timeout_s": 120})["timed_out"] is False
    gated = submit(d, "--gpus", "0", "--", "sh", "-c", "while [ ! -e go ]; do sleep 0.01; done")
    asked = [*reversed(ids), gated]
    d.wait_state(gated, "running")
    (d.root / "go").touch()
    reply = d.call({"type": "wait", "ids": asked, "timeout_s": 120})
    assert [j["id"] for j in reply["jobs"]] == asked
    assert {j["state"] for j in reply["jobs"]} == {"succeeded"}
    unknown = d.cli("wait", str(ids[0]), "99999", check=False)
    assert unknown.returncode == 1 and "99999" in unknown.stderr
