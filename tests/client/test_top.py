"""`gpusv top`'s rendering, without a terminal or a daemon."""

from __future__ import annotations

import io
from typing import Any

import pytest

from supervisor.client.top import duration_text, render, run, size_text


def snapshot(**over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "gpus": [
            {
                "index": i,
                "pci_bus_id": f"0000:0{i + 1}:00.0",
                "utilization_pct": 97.0 if i == 0 else 0.0,
                "vram_used_mb": 20 * 1024 if i == 0 else 0,
                "vram_total_mb": 24 * 1024,
                "health": "ok" if i == 0 else "lost",
                "gpu_hangs": 2 if i == 0 else 0,
                "running_jobs": [12] if i == 0 else [],
            }
            for i in range(2)
        ],
        "running": [
            {
                "id": 12,
                "name": "",
                "argv": ["python", "train.py", "--epochs", "3"],
                "gpus": [0],
                "runtime_s": 3723.4,
                "rss_mb": 10 * 1024,
                "peak_rss_mb": 12 * 1024,
                "progress": "step 1200/5000",
            }
        ],
        "held": [{"id": 15, "name": "big", "waiting_for": "waiting for host RAM: needs ~93 GiB"}],
        "queued": 1,
        "recent_hangs": [
            {
                "at": "2025-01-01T00:00:00.000Z",
                "job": 9,
                "gpu": 0,
                "pci_bus_id": "0000:01:00.0",
                "driver_version": "550.54.15",
                "evidence": {"source": "kernel_log"},
            }
        ],
        "host_memory": {
            "limit_mb": 120 * 1024,
            "available_mb": 60 * 1024,
            "projected_mb": 40 * 1024,
            "free_for_new_mb": 15 * 1024,
        },
        "problems": ["GPU 1 (0000:02:00.0) is lost"],
        "draining": False,
    }
    snap.update(over)
    return snap


def test_every_section_shows_its_rows() -> None:
    text = "\n".join(render(snapshot(), 200, 100))
    assert "1 running, 1 queued (1 waiting), GPUs 1/2 ok" in text
    assert "limit 120.0GiB  available 60.0GiB  projected 40.0GiB  free for new 15.0GiB" in text
    assert "! GPU 1 (0000:02:00.0) is lost" in text
    row = next(line for line in text.splitlines() if line.startswith("12 "))
    for cell in ("1:02:03", "10.0GiB", "12.0GiB", "step 1200/5000", "python train.py --epochs 3"):
        assert cell in row
    assert any(
        line.startswith("15 ") and "waiting for host RAM" in line for line in text.split("\n")
    )
    assert "0000:01:00.0  97%   20.0GiB/24.0GiB  ok" in text
    assert "RECENT HANGS (1)" in text and "550.54.15" in text


def test_fits_the_screen() -> None:
    lines = render(snapshot(), 30, 8)
    assert len(lines) == 8
    assert all(len(line) <= 30 for line in lines)
    assert lines[-1].startswith("... ")
    assert render(snapshot(), 80, 0) == []


def test_an_idle_box() -> None:
    lines = render(snapshot(running=[], held=[], recent_hangs=[], problems=[], queued=0), 80, 50)
    assert "RUNNING (0)" in lines and "WAITING (0)" in lines
    assert not any("HANGS (" in line for line in lines)


def test_without_a_terminal_prints_one_snapshot_whole() -> None:
    out = io.StringIO()
    calls: list[int] = []

    def fetch() -> dict[str, Any]:
        calls.append(1)
        return snapshot()

    assert run(fetch, out=out, inp=io.StringIO()) == 0
    assert len(calls) == 1
    assert "python train.py --epochs 3" in out.getvalue()
    assert "\x1b" not in out.getvalue()
    with pytest.raises(ValueError, match="interval"):
        run(snapshot, interval=0, out=out, inp=io.StringIO())


def test_figures() -> None:
    assert size_text(None) == "-"
    assert size_text(512) == "512MiB"
    assert size_text(1536) == "1.5GiB"
    assert size_text(2 << 20) == "2.0TiB"
    assert duration_text(5) == "0:05"
    assert duration_text(3723) == "1:02:03"
