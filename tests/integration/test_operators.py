"""The operators' view end to end: Prometheus metrics over HTTP, `gpusv top` in a real
pseudo-terminal, `gpusv health` exit codes, hooks, dependencies and priorities."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pty
import select
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
from prometheus_client.parser import text_string_to_metric_families

from supervisor.core.commands import Ended, SubmitJobs
from supervisor.core.jobs import ExitStatus, JobSpec
from supervisor.core.outcome import Facts
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import load
from supervisor.daemon.dispatcher import Dispatcher
from supervisor.daemon.engine import Engine, submitted_ids
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.watch.memory import available_mb, read_meminfo
from supervisor.gpus.base import dcgm_bus_id
from supervisor.gpus.simulated import simulated_uuid

from .conftest import Daemon

PY = sys.executable
MIB = 1 << 20
WRITE_STDIN = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read())"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return parse(resp.read().decode())


def metric(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def until(flag: Path, then: str = "") -> str:
    """A job that runs until `flag` exists, then runs `then`."""
    return f"while [ ! -e {flag} ]; do sleep 0.05; done; {then}"


def xid_line(card: int) -> str:
    return (
        f"NVRM: Xid (PCI:0000:{card + 1:02x}:00): 109, pid=1, name=x, Ch 00000008, "
        "errorString CTX SWITCH TIMEOUT, Info 0x58005"
    )


def hook_records(path: Path, n: int, d: Daemon) -> dict[int, dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    records = d.wait_for(lambda: len(read()) >= n and read(), what=f"{n} hook records")
    assert len(records) == n, records
    return {r["id"]: r for r in records}


# ---- metrics -------------------------------------------------------------------------


def test_metrics_over_http_after_success_failure_hold_and_hang(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    port = free_port()
    hang_hook = tmp_path / "on_gpu_hang.jsonl"
    d = make_daemon(
        config=f"""
metrics_listen = "127.0.0.1:{port}"
cpu_slots = 4
[host_memory]
limit = "1G"
reserve = "100M"
[hooks]
on_gpu_hang = {json.dumps([PY, "-c", WRITE_STDIN, str(hang_hook)])}
"""
    )
    ok = d.submit("true", gpus=0)
    bad = d.submit("false", gpus=0, retries=0)
    assert d.wait_done(ok)["state"] == "succeeded"
    assert d.wait_done(bad)["state"] == "failed"
    big = d.submit("sleep", "60", gpus=0, mem_mb=600)
    d.wait_state(big, "running")
    # A key with no history: its declared 600 MiB counts (`true` ran above, so its own
    # key has an observed peak that would count instead).
    held = d.submit("true", gpus=0, mem_mb=600, mem_key="never-ran")
    d.wait_for(lambda: "host RAM" in (d.show(held)["waiting_for"] or ""), what="a host_ram hold")
    hung = d.submit("sleep", "60", gpus=1, gpu_hang_retries=0)
    card = d.wait_state(hung, "running")["gpus"][0]
    gpu = next(g for g in d.call({"type": "gpus"})["gpus"] if g["index"] == card)
    labels = {"gpu": str(card), "UUID": gpu["uuid"], "pci_bus_id": dcgm_bus_id(gpu["pci_bus_id"])}
    d.wait_for(
        lambda: metric(scrape(port), "gpusv_gpu_running_jobs", **labels) == 1,
        what="the hung job on its card",
    )
    d.append_kernel(xid_line(card))
    assert d.wait_done(hung)["reason"] == "gpu_hang"

    hang_labels = {**labels, "driver_version": gpu["driver_version"]}
    s = d.wait_for(
        lambda: (
            (s := scrape(port))
            and metric(s, "gpusv_gpu_hangs_total", **hang_labels) == 1
            and metric(s, "gpusv_jobs_held", reason="host_ram") == 1
            and s
        ),
        what="the hang and the hold in the scraped metrics",
    )
    expected = {
        ("gpusv_jobs", "state", "succeeded"): 1,
        ("gpusv_jobs", "state", "failed"): 2,
        ("gpusv_jobs", "state", "running"): 1,
        ("gpusv_jobs", "state", "queued"): 1,
        ("gpusv_jobs", "state", "cancelled"): 0,
        ("gpusv_attempt_failures_total", "reason", "exit_nonzero"): 1,
        ("gpusv_attempt_failures_total", "reason", "gpu_hang"): 1,
        ("gpusv_attempt_failures_total", "reason", "oom_killed"): 0,
    }
    for (name, key, val), want in expected.items():
        assert metric(s, name, **{key: val}) == want, (name, val)
    assert metric(s, "gpusv_gpu_running_jobs", **labels) == 0
    assert metric(s, "gpusv_gpu_memory_total_bytes", **labels) == 8192 * MIB
    assert metric(s, "gpusv_gpu_healthy", **labels) == 1
    assert metric(s, "gpusv_host_memory_limit_bytes") == 1024 * MIB
    assert metric(s, "gpusv_host_memory_reserve_bytes") == 100 * MIB
    assert (metric(s, "gpusv_host_memory_projected_bytes") or 0) >= 600 * MIB
    assert (metric(s, "gpusv_host_memory_free_for_new_bytes") or 0) < 600 * MIB  # why it waits
    assert metric(s, "gpusv_dispatch_latency_seconds_count") == 4  # the held job never started
    assert 0 <= (metric(s, "gpusv_watchdog_heartbeat_age_seconds") or -1) < 30
    assert metric(s, "gpusv_deadman_fires_total") == 0
    assert metric(s, "gpusv_node_healthy") == 1

    assert (metric(s, "process_resident_memory_bytes") or 0) > 0  # the daemon's own
    text = parse(d.cli("metrics").stdout)  # the same figures for a textfile collector
    assert not any(name.startswith("process_") for name, _ in text)
    assert metric(text, "gpusv_gpu_hangs_total", **hang_labels) == 1
    assert metric(text, "gpusv_jobs", state="failed") == 2
    record = hook_records(hang_hook, 1, d)[hung]
    assert record["attempt"]["reason"] == "gpu_hang"
    assert record["state"] == "failed"


# ---- top -----------------------------------------------------------------------------


def read_until(fd: int, needles: list[bytes], timeout: float = 20.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while not all(n in seen for n in needles):
        left = deadline - time.monotonic()
        assert left > 0, f"never saw {needles} in {seen[-2000:]!r}"
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 65536)
    return seen


def test_top_draws_the_running_job_in_a_terminal_and_quits_on_q(daemon: Daemon) -> None:
    job = daemon.submit("sleep", "60", name="render-frame-942")
    daemon.wait_state(job, "running")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    before = termios.tcgetattr(slave)
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "supervisor.client.cli",
            "--socket",
            str(daemon.socket),
            "top",
            "--interval",
            "0.2",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=daemon.env,
    )
    try:
        seen = read_until(master, [b"RUNNING (1)", f"{job} ".encode(), b"render-frame-942"])
        row = next(line for line in seen.split(b"\n") if b"render-frame-942" in line)
        assert row.lstrip(b"\r").startswith(f"{job} ".encode())
        os.write(master, b"q")
        assert proc.wait(timeout=10) == 0
        assert b"\x1b[?1049l" in read_until(master, [b"\x1b[?1049l"])  # left the alt screen
        assert termios.tcgetattr(slave) == before  # cbreak undone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


# ---- health --------------------------------------------------------------------------


def test_health_exit_codes_for_a_lost_card_and_a_healthy_box(daemon: Daemon) -> None:
    healthy = daemon.cli("health")
    assert (healthy.returncode, healthy.stdout) == (0, "ok\n")
    daemon.set_card(0, lost=True)
    sick = daemon.wait_for(
        lambda: (r := daemon.cli("health", check=False)).returncode == 1 and r,
        what="health to fail",
    )
    assert "GPU 0 (0000:01:00.0) is lost" in sick.stdout
    as_json = json.loads(daemon.cli("health", "--json", check=False).stdout)
    assert as_json["ok"] is False and as_json["problems"]
    text = parse(daemon.cli("metrics").stdout)
    card = {"gpu": "0", "UUID": simulated_uuid(0), "pci_bus_id": "00000000:01:00.0"}
    assert metric(text, "gpusv_gpu_healthy", **card) == 0
    assert metric(text, "gpusv_node_healthy") == 0
    daemon.set_card(0, lost=False)
    daemon.wait_for(lambda: daemon.cli("health", check=False).returncode == 0, what="recovery")


def test_health_fails_for_ten_minutes_after_a_deadman_exit(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(start=False)
    d.state.mkdir(parents=True)
    # What the deadman leaves on its way out (daemon._deadman_exit), for the next start.
    marker = {"kind": "deadman", "at": time.time() - 5, "code": 70}
    (d.state / "last-exit.json").write_text(json.dumps(marker))
    d.start()
    result = d.cli("health", check=False)
    assert result.returncode == 1
    assert "the deadman restarted gpusvd" in result.stdout
    assert metric(parse(d.cli("metrics").stdout), "gpusv_deadman_fires_total") == 1


# ---- hooks ---------------------------------------------------------------------------


def test_on_finish_gets_the_job_json_however_the_job_ends(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    out = tmp_path / "on_finish.jsonl"
    d = make_daemon(config=f"[hooks]\non_finish = {json.dumps([PY, '-c', WRITE_STDIN, str(out)])}")
    flag = tmp_path / "flag"
    ok = d.submit("true", gpus=0)
    parent = d.submit("sh", "-c", until(flag, "exit 3"), gpus=0, retries=0)
    child = d.submit("true", gpus=0, after=[parent])
    cancelled = d.submit("true", gpus=0, after=[parent])
    d.wait_done(ok)
    assert d.cli("cancel", str(cancelled)).stdout == f"{cancelled} cancelled\n"
    flag.touch()
    assert d.wait_done(child)["reason"] == "dependency_failed"
    records = hook_records(out, 4, d)
    assert records[ok]["state"] == "succeeded"
    assert records[ok]["attempt"]["exit_code"] == 0
    assert records[parent]["state"] == "failed"
    assert records[parent]["attempt"]["reason"] == "exit_nonzero"
    assert (records[child]["state"], records[child]["reason"]) == ("failed", "dependency_failed")
    assert (records[cancelled]["state"], records[cancelled]["attempt"]) == ("cancelled", None)
    assert records[child]["argv"] == ["true"]


def test_a_hook_past_its_timeout_is_killed_with_its_children_and_the_daemon_goes_on(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    pids = tmp_path / "hook.pids"
    hook = ["sh", "-c", f"sleep 60 & echo $$ $! >> {pids}; wait"]
    d = make_daemon(config=f"[hooks]\non_finish = {json.dumps(hook)}\ntimeout_s = 0.5")
    first = d.submit("true", gpus=0)
    assert d.wait_done(first)["state"] == "succeeded"
    hook_pids = [int(p) for p in d.wait_for(lambda: pids.exists() and pids.read_text().split())]

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    d.wait_for(lambda: all(gone(p) for p in hook_pids), what="the hook and its child killed")
    d.wait_for(lambda: "hook timed out and was killed" in d.log_text(), what="the log line")
    second = d.submit("true", gpus=0)
    assert d.wait_done(second)["state"] == "succeeded"
    d.wait_for(lambda: len(pids.read_text().split()) == 4, what="the next job's hook")


# ---- dependencies and priorities -------------------------------------------------------


def submit(d: Daemon, *args: str) -> int:
    return int(d.cli("submit", "--gpus", "0", *args).stdout)


def test_a_chain_runs_in_order_and_after_a_succeeded_job_starts_at_once(
    daemon: Daemon, tmp_path: Path
) -> None:
    flag, order = tmp_path / "flag", tmp_path / "order"
    a = submit(daemon, "--", "sh", "-c", until(flag, f"echo a >> {order}"))
    b = submit(daemon, "--after", str(a), "--", "sh", "-c", f"echo b >> {order}")
    c = submit(daemon, "--after", str(b), "--", "sh", "-c", f"echo c >> {order}")
    assert daemon.show(b)["waiting_for"] == f"waiting for job {a}"
    assert daemon.show(c)["waiting_for"] == f"waiting for job {b}"
    held = parse(daemon.cli("metrics").stdout)
    assert metric(held, "gpusv_jobs_held", reason="dependency") == 2
    flag.touch()
    done = [daemon.wait_done(j) for j in (a, b, c)]
    assert [j["state"] for j in done] == ["succeeded"] * 3
    assert order.read_text().split() == ["a", "b", "c"]
    for parent, child in ((done[0], done[1]), (done[1], done[2])):
        assert child["started_at"] >= parent["ended_at"]
    again = submit(daemon, "--after", f"{a},{c}", "--", "true")
    assert daemon.wait_done(again)["state"] == "succeeded"
    refused = daemon.cli("submit", "--after", "99999", "--", "true", check=False)
    assert refused.returncode == 1
    assert "no job 99999" in refused.stderr
    assert daemon.call({"type": "list"})["jobs"][0]["id"] == again  # nothing was created


def test_a_failed_parent_fails_its_children_and_grandchildren(
    daemon: Daemon, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    parent = submit(daemon, "--retries", "0", "--", "sh", "-c", until(flag, "exit 3"))
    child = submit(daemon, "--after", str(parent), "--", "true")
    grandchild = submit(daemon, "--after", str(child), "--", "true")
    flag.touch()
    assert daemon.wait_done(parent)["state"] == "failed"
    for job_id in (child, grandchild):
        job = daemon.wait_done(job_id)
        assert (job["state"], job["reason"]) == ("failed", "dependency_failed")
        assert job["attempts"] == []  # never ran
        assert any(e["kind"] == "dependency_failed" for e in job["events"])
    late = submit(daemon, "--after", str(parent), "--", "true")  # the parent has already failed
    assert daemon.wait_done(late)["reason"] == "dependency_failed"


async def test_no_dispatch_pass_starts_a_job_before_its_parents_are_known(
    tmp_path: Path,
) -> None:
    """In process, on the real engine, dispatch loop and Store: a pass that runs while a
    submit is still reading an ended parent from the store must not start the child."""
    (tmp_path / "c.toml").write_text("cpu_slots = 4")
    flags = {"state_dir": str(tmp_path), "socket": str(tmp_path / "s")}
    cfg = load(tmp_path / "c.toml", flags=flags)
    store = await Store.open(tmp_path / "db")
    broker = Broker()
    engine = Engine(store, broker)
    book = MemoryBook(store, broker, 0.0)
    sched = Dispatcher(
        cfg,
        engine,
        book,
        broker,
        cards=list,
        rss_mb=lambda _: 0,
        mem_total_mb=read_meminfo().total_mb,
        available_mb=available_mb,
    )
    spec = JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0, gpus=0)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run_writer)
        done, active = submitted_ids(await engine.do(SubmitJobs((spec, spec))))
        await sched.dispatch_pass()  # both start
        await engine.do(Ended(done, 1, Facts(ExitStatus(0, None))))
        submitted = anyio.Event()

        async def keep_dispatching() -> None:
            while not submitted.is_set():
                await sched.dispatch_pass()
                await anyio.sleep(0)

        tg.start_soon(keep_dispatching)
        child_spec = dataclasses.replace(spec, after=(done, active))
        [child] = submitted_ids(await engine.do(SubmitJobs((child_spec,))))
        submitted.set()
        assert active in engine.table.live
        assert child not in engine.table.live
        assert engine.table.pending[child] == {active}
        assert engine.table.jobs[child].waiting_for == f"waiting for job {active}"
        tg.cancel_scope.cancel()
    await store.close()


def test_the_higher_priority_job_starts_first(daemon: Daemon, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    blocker = daemon.submit("sh", "-c", until(first), gpus=2)
    daemon.wait_state(blocker, "running")
    low = int(daemon.cli("submit", "--gpus", "2", "--", "true").stdout)
    high = int(
        daemon.cli(
            "submit", "--gpus", "2", "--priority", "10", "--", "sh", "-c", until(second)
        ).stdout
    )
    first.touch()
    daemon.wait_state(high, "running")
    assert daemon.show(low)["state"] == "queued"  # both cards went to the higher priority
    second.touch()
    assert daemon.wait_done(low)["state"] == "succeeded"
    assert daemon.show(low)["started_at"] >= daemon.show(high)["ended_at"]
