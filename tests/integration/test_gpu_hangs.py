"""GPU hangs and resets end to end: a file kernel log, simulated cards, a real daemon."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from .conftest import Daemon

# Real lines (shared/kernel-log corpus), pointed at the simulated cards' bus ids.
XID_109_CARD0 = (
    "[10900.272611] NVRM: Xid (PCI:0000:01:00): 109, pid=11263, name=Renderer, "
    "Ch 00000020, errorString CTX SWITCH TIMEOUT, Info 0xac00d"
)
XID_79_CARD0 = "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
AMD_RING_TIMEOUT_CARD0 = (
    "[ 1234.567890] amdgpu 0000:01:00.0: amdgpu: ring gfx_0.0.0 timeout, "
    "signaled seq=3075, emitted seq=3077"
)
HANG_ONCE = 'if [ "$GPUSV_ATTEMPT" = 1 ]; then echo started > {marker}; sleep 300; fi'


def test_reset_line_fails_the_attempt_as_gpu_hang_and_reruns_on_the_same_card(
    daemon: Daemon,
) -> None:
    marker = daemon.root / "started"
    job = daemon.submit("sh", "-c", HANG_ONCE.format(marker=marker), labels={"frame": "942"})
    daemon.wait_for(marker.exists, what="the job to start")
    assert daemon.show(job)["gpus"] == [0]
    appended = time.monotonic()
    daemon.append_kernel(XID_109_CARD0)
    daemon.wait_for(
        lambda: daemon.show(job)["attempts"][0]["reason"] == "gpu_hang",
        what="attempt 1 to end as gpu_hang",
    )
    detected_s = time.monotonic() - appended
    done = daemon.wait_done(job)
    assert done["state"] == "succeeded", done
    first, second = done["attempts"]
    assert first["evidence"]["source"] == "kernel_log"
    assert "Xid" in first["evidence"]["lines"][0]
    assert second["gpus"] == [0]  # the card is not locked out
    assert done["retries"]["gpu_hang"]["used"] == 1
    assert done["retries"]["ordinary"]["used"] == 0
    stats = json.loads(daemon.cli("stats", "--json").stdout)
    (hang,) = stats["gpu_hangs"]
    assert hang["job"] == job and hang["gpu"] == 0 and hang["attempt"] == 1
    assert hang["pci_bus_id"] == "0000:01:00.0"
    assert hang["driver_version"]
    assert hang["labels"] == {"frame": "942"}
    assert hang["host_mem_available_mb"] > 0
    assert stats["failures"]["gpu_hang"] == 1
    gpus = json.loads(daemon.cli("gpus", "--json").stdout)
    assert gpus[0]["gpu_hangs"] == 1 and gpus[0]["health"] == "ok"
    print(f"kernel line -> gpu_hang recorded: {detected_s:.2f}s")


def test_a_hang_record_names_the_job_and_the_frame_it_had_reached(daemon: Daemon) -> None:
    script = 'if [ "$GPUSV_ATTEMPT" = 1 ]; then echo "Fra:17 Mem:1.2G"; sleep 300; fi'
    job = daemon.submit("sh", "-c", script, name="shot-010", progress_regex=r"Fra:(\d+)", retries=0)
    daemon.wait_for(lambda: daemon.show(job)["progress"] == "17", what="the frame reached")
    daemon.append_kernel(XID_109_CARD0)
    done = daemon.wait_done(job)
    assert done["state"] == "succeeded"
    (hang,) = json.loads(daemon.cli("stats", "--json").stdout)["gpu_hangs"]
    assert (hang["job"], hang["name"], hang["frame"]) == (job, "shot-010", "17")
    assert hang["host_mem_available_mb"] > 0
    # Stamped when the line came, before the hung attempt's end was recorded.
    assert hang["at"] <= done["attempts"][0]["ended_at"]


def test_amd_ring_timeout_is_a_hang_too(daemon: Daemon) -> None:
    marker = daemon.root / "started"
    job = daemon.submit("sh", "-c", HANG_ONCE.format(marker=marker))
    daemon.wait_for(marker.exists, what="the job to start")
    daemon.append_kernel(AMD_RING_TIMEOUT_CARD0)
    done = daemon.wait_done(job)
    assert done["attempts"][0]["reason"] == "gpu_hang"
    assert done["state"] == "succeeded"


def test_fallen_off_the_bus_marks_the_card_lost_and_reruns_elsewhere(daemon: Daemon) -> None:
    marker = daemon.root / "started"
    job = daemon.submit("sh", "-c", HANG_ONCE.format(marker=marker))
    daemon.wait_for(marker.exists, what="the job to start")
    daemon.append_kernel(XID_79_CARD0)
    done = daemon.wait_done(job)
    assert [a["reason"] for a in done["attempts"]] == ["gpu_hang", None]
    assert done["attempts"][1]["gpus"] == [1]
    gpus = json.loads(daemon.cli("gpus", "--json").stdout)
    assert gpus[0]["health"] == "lost" and gpus[1]["health"] == "ok"
    health = daemon.cli("health", check=False)
    assert health.returncode == 1 and "GPU 0" in health.stdout


def test_exit_just_before_a_reset_line_is_a_gpu_hang(daemon: Daemon) -> None:
    # The job writes the line itself as it exits, so the line and the exit reach the
    # daemon together, in either order, however loaded the machine: the exit grace
    # must tie them without a test-side race against it.
    line = XID_109_CARD0.replace("'", "")
    script = f'if [ "$GPUSV_ATTEMPT" = 1 ]; then echo "{line}" >> {daemon.kernel_log}; exit 1; fi'
    job = daemon.submit("sh", "-c", script, retries=1)
    done = daemon.wait_done(job)
    assert done["state"] == "succeeded"
    assert done["attempts"][0]["reason"] == "gpu_hang"
    assert done["retries"]["gpu_hang"]["used"] == 1
    assert done["retries"]["ordinary"]["used"] == 0


def test_exit_with_no_line_is_exit_nonzero(daemon: Daemon) -> None:
    job = daemon.submit("sh", "-c", "exit 1", retries=0)
    done = daemon.wait_done(job)
    assert done["reason"] == "exit_nonzero"
    assert done["retries"]["gpu_hang"]["used"] == 0


def test_watchdog_fails_a_silent_job_at_idle_gpu(daemon: Daemon) -> None:
    job = daemon.submit(
        "sh", "-c", 'if [ "$GPUSV_ATTEMPT" = 1 ]; then sleep 300; fi', progress_timeout_s=1.0
    )
    done = daemon.wait_done(job)
    assert done["state"] == "succeeded"
    evidence = done["attempts"][0]["evidence"]
    assert done["attempts"][0]["reason"] == "gpu_hang"
    assert evidence["source"] == "watchdog"
    assert evidence["silent_s"] >= 1.0
    assert evidence["max_utilization_pct"] <= 1.0


def test_watchdog_leaves_a_silent_job_on_a_busy_card_alone(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G")
    d.set_card(0, utilization_pct=95)
    d.wait_for(
        lambda: json.loads(d.cli("gpus", "--json").stdout)[0]["utilization_pct"] == 95,
        what="the monitor to read the busy card",
    )
    busy = d.submit("sleep", "300", progress_timeout_s=0.5)
    assert d.wait_state(busy, "running")["gpus"] == [0]
    # The same silence on the idle card, started later: once the watchdog has failed
    # it, it has also judged the busy card's job past the same timeout.
    idle = d.submit("sleep", "300", progress_timeout_s=0.5, gpu_hang_retries=0)
    done = d.wait_done(idle)
    assert done["gpus"] == [1] or done["attempts"][0]["gpus"] == [1]
    assert done["reason"] == "gpu_hang"
    assert done["attempts"][0]["evidence"]["source"] == "watchdog"
    shown = d.show(busy)
    assert shown["state"] == "running" and len(shown["attempts"]) == 1
    d.cli("cancel", str(busy))


def test_progress_regex_shows_the_last_match(daemon: Daemon) -> None:
    script = "for f in 940 941 942; do echo Fra:$f; sleep 0.3; done; sleep 300"
    job = daemon.submit("sh", "-c", script, progress_regex=r"Fra:\d+")
    daemon.wait_for(lambda: daemon.show(job)["progress"] == "Fra:942", what="progress Fra:942")
    assert "Fra:942" in daemon.cli("list").stdout
    daemon.cli("cancel", str(job))


def test_a_job_that_keeps_hanging_spends_its_hang_budget_then_fails(daemon: Daemon) -> None:
    job = daemon.submit("sleep", "300", progress_timeout_s=0.5, gpu_hang_retries=2, retries=3)
    done = daemon.wait_done(job, timeout=40)
    assert done["state"] == "failed"
    assert done["reason"] == "gpu_hang"
    assert [a["reason"] for a in done["attempts"]] == ["gpu_hang"] * 3
    assert done["retries"]["gpu_hang"] == {"used": 2, "budget": 2}
    assert done["retries"]["ordinary"]["used"] == 0


def test_a_line_after_the_exit_reclassifies_a_queued_retry(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G")
    marker = d.root / "started"
    script = f'if [ "$GPUSV_ATTEMPT" = 1 ]; then echo x > {marker}; sleep 0.5; exit 1; fi'
    job = d.submit("sh", "-c", script)
    d.wait_for(marker.exists, what="the job to start")
    blocker = d.submit("sleep", "300", priority=10)  # keeps the retry queued
    d.wait_state(blocker, "running")
    first = d.show(job)
    assert first["state"] == "queued"
    assert first["attempts"][0]["reason"] == "exit_nonzero"
    assert first["retries"]["ordinary"]["used"] == 1
    d.append_kernel(XID_109_CARD0)
    # The attempt (read from the store) and the job's budgets (held in memory) change one
    # after the other: wait for both.
    fixed = d.wait_for(
        lambda: (
            (j := d.show(job))["attempts"][0]["reason"] == "gpu_hang"
            and j["retries"]["gpu_hang"]["used"] == 1
            and j
        ),
        what="the attempt reclassified",
    )
    assert fixed["retries"]["ordinary"]["used"] == 0
    assert fixed["retries"]["gpu_hang"]["used"] == 1
    d.cli("cancel", str(blocker))
    assert d.wait_done(job)["state"] == "succeeded"
    hangs = json.loads(d.cli("stats", "--json").stdout)["gpu_hangs"]
    # The line also hit the blocker, which was on the card when it arrived.
    assert sorted(h["job"] for h in hangs) == [job, blocker]


XID_109_CARD1 = XID_109_CARD0.replace("PCI:0000:01:00", "PCI:0000:02:00")


def test_a_hang_line_for_a_card_with_no_job_blames_nobody(daemon: Daemon) -> None:
    busy = daemon.submit("sleep", "300")
    assert daemon.wait_state(busy, "running")["gpus"] == [0]
    daemon.append_kernel(XID_109_CARD1)
    daemon.wait_for(
        lambda: "gpu fault" in daemon.log_text() and "gpu=1" in daemon.log_text(),
        what="the daemon to read the line for card 1",
    )
    shown = daemon.show(busy)
    assert shown["state"] == "running" and len(shown["attempts"]) == 1
    assert shown["attempts"][0]["reason"] is None
    assert daemon.call({"type": "stats"})["gpu_hangs"] == []
    gpus = json.loads(daemon.cli("gpus", "--json").stdout)
    assert [g["health"] for g in gpus] == ["ok", "ok"]
    # A job that starts on that card later and fails was not hit by the earlier line.
    later = daemon.submit("sh", "-c", "exit 1", retries=0)
    done = daemon.wait_done(later)
    assert done["attempts"][0]["gpus"] == [1]
    assert done["reason"] == "exit_nonzero"
    assert daemon.call({"type": "stats"})["gpu_hangs"] == []
    daemon.cli("cancel", str(busy))
