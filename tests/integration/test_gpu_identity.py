"""Card identity and honest readings in a real daemon on simulated cards: UUIDs, the
allocation gpusvd runs in, a card wedged at start, unknown utilization, a job busy on the
CPU, and the stall timeout."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

from supervisor.gpus.simulated import simulated_uuid

from .conftest import Daemon

ENV_DUMP = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if 'VISIBLE' in k or k.startswith('GPUSV_GPU') or k == 'CUDA_DEVICE_ORDER'}))"  # noqa: E501


def job_env(d: Daemon, job: int) -> dict[str, str]:
    done = d.wait_done(job)
    assert done["state"] == "succeeded", done
    out = (d.state / "logs").glob(f"{job}*out*")
    text = "".join(p.read_text() for p in out)
    return dict(json.loads(text.strip().splitlines()[-1]))


def test_gpus_json_carries_uuids_and_jobs_get_them(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(gpus="2x8G")
    cards = d.call({"type": "gpus"})["gpus"]
    assert [c["uuid"] for c in cards] == [simulated_uuid(0), simulated_uuid(1)]
    assert all(c["allocation"] is None and c["mig"] is False for c in cards)
    job = d.submit("python3", "-c", ENV_DUMP, gpus=1)
    env = job_env(d, job)
    assert d.show(job)["attempts"][0]["gpu_uuids"] == [simulated_uuid(0)]
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUSV_GPU_UUIDS"] == simulated_uuid(0)
    metrics = d.call({"type": "metrics"})["text"]
    assert f'UUID="{simulated_uuid(1)}"' in metrics and 'pci_bus_id="00000000:02:00.0"' in metrics


def test_uuids_in_the_visibility_variable_when_configured(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G", config='[gpus]\nvisible_devices = "uuid"\n')
    env = job_env(d, d.submit("python3", "-c", ENV_DUMP, gpus=2))
    both = f"{simulated_uuid(0)},{simulated_uuid(1)}"
    assert env["CUDA_VISIBLE_DEVICES"] == both and env["GPUSV_GPU_UUIDS"] == both


def test_cuda_visible_devices_of_the_daemon_restricts_it_to_that_card(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="3x8G", env={"CUDA_VISIBLE_DEVICES": "1"})
    cards = d.call({"type": "gpus"})["gpus"]
    assert [(c["uuid"], c["pci_bus_id"]) for c in cards] == [(simulated_uuid(1), "0000:02:00.0")]
    assert "CUDA_VISIBLE_DEVICES=1" in cards[0]["allocation"]
    assert "1 of 3 cards" in cards[0]["allocation"]
    assert "CUDA_VISIBLE_DEVICES=1" in d.cli("gpus").stdout
    env = job_env(d, d.submit("python3", "-c", ENV_DUMP, gpus=1))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # the host-wide number CUDA counts by
    assert env["GPUSV_GPU_UUIDS"] == simulated_uuid(1)


def test_a_card_wedged_at_start_starts_lost_and_the_others_are_served(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="3x8G", config="[gpus]\nprobe_deadline_s = 0.5\n", start=False)
    d.set_card(1, wedged=True)
    d.start()
    cards = d.call({"type": "gpus"})["gpus"]
    assert [c["health"] for c in cards] == ["ok", "lost", "ok"]
    assert [c["index"] for c in cards] == [0, 1, 2]
    health = d.call({"type": "health"})["health"]
    assert not health["ok"] and any("GPU 1" in p for p in health["problems"])
    job = d.submit("true", gpus=2)
    assert d.wait_done(job)["attempts"][0]["gpus"] == [0, 2]
    d.set_card(1, wedged=False)
    d.wait_for(
        lambda: d.call({"type": "gpus"})["gpus"][1]["health"] == "ok",
        what="card 1 to answer once its driver returns",
    )


def test_unknown_utilization_and_cpu_work_never_look_idle(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="3x8G", config="[host_memory]\nsample_interval_s = 0.1\n")
    d.set_card(0, utilization_pct=None)  # cannot be read: MIG, or no busy counter
    spin = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass"
    unknown = d.submit("sleep", "300", progress_timeout_s=0.5)
    d.wait_state(unknown, "running")
    busy_cpu = d.submit("python3", "-c", spin, progress_timeout_s=0.5)
    d.wait_state(busy_cpu, "running")
    idle = d.submit("sleep", "300", progress_timeout_s=0.5, gpu_hang_retries=0)
    assert [d.show(j)["gpus"] for j in (unknown, busy_cpu, idle)] == [[0], [1], [2]]
    # The idle job on a card at 0 % is failed; by then the others had the same chance.
    done = d.wait_done(idle)
    assert done["attempts"][0]["reason"] == "gpu_hang"
    assert "idle" in done["attempts"][0]["evidence"]["rule"]
    for job in (unknown, busy_cpu):
        shown = d.show(job)
        assert shown["state"] == "running" and len(shown["attempts"]) == 1, shown
    d.cli("cancel", str(unknown), str(busy_cpu))


def test_the_stall_timeout_fails_a_silent_job_at_full_utilization(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G")
    d.set_card(0, utilization_pct=100)  # a hung collective spins its card
    job = d.submit("sleep", "300", stall_timeout_s=1.0, gpu_hang_retries=0)
    done = d.wait_done(job)
    attempt = done["attempts"][0]
    assert attempt["reason"] == "gpu_hang", done
    assert "at any utilization" in attempt["evidence"]["rule"]
    assert attempt["evidence"]["max_utilization_pct"] == 100


def test_sigusr1_lets_go_of_the_cards_and_sigusr2_takes_them_back(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G")
    assert d.proc is not None
    d.proc.send_signal(signal.SIGUSR1)
    d.wait_for(
        lambda: all(c["health"] == "lost" for c in d.call({"type": "gpus"})["gpus"]),
        what="every card released",
    )
    problems = d.call({"type": "health"})["health"]["problems"]
    assert any("released" in p for p in problems), problems
    job = d.submit("true", gpus=1)
    assert d.show(job)["state"] == "queued"
    d.proc.send_signal(signal.SIGUSR2)
    d.wait_for(
        lambda: all(c["health"] == "ok" for c in d.call({"type": "gpus"})["gpus"]),
        what="every card taken back",
    )
    done = d.wait_done(job)
    assert done["state"] == "succeeded" and done["attempts"][0]["gpu_uuids"]


def test_a_card_wedged_at_start_under_a_short_abort_deadline_is_lost_not_an_exit_70(
    make_daemon: Callable[..., Daemon],
) -> None:
    """The probe's deadline fits itself under the abort deadline: one wedged card costs
    that card, never the node."""
    d = make_daemon(gpus="2x8G", env={"GPUSVD_ABORT_DEADLINE_S": "3"}, start=False)
    d.set_card(0, wedged=True)
    d.start()
    assert [c["health"] for c in d.call({"type": "gpus"})["gpus"]] == ["lost", "ok"]
    job = d.submit("true", gpus=1)
    assert d.wait_done(job)["attempts"][0]["gpus"] == [1]
    d.set_card(0, wedged=False)


def test_a_card_probe_longer_than_the_abort_deadline_allows_is_refused_at_start(
    make_daemon: Callable[..., Daemon],
) -> None:
    config = "[gpus]\nprobe_deadline_s = 10\n[deadman]\nabort_deadline_s = 10\n"
    d = make_daemon(gpus="2x8G", config=config, start=False)
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(timeout=60) == 2
    lines = [line for line in d.log_text().splitlines() if "probe_deadline_s" in line]
    assert len(lines) == 1 and "at most half of deadman.abort_deadline_s" in lines[0], lines
