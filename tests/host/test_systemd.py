"""gpusvd installed as an operator would, under a real systemd as PID 1."""

from __future__ import annotations

from .conftest import UNIT, Gpusvd


def test_start_is_ready_with_a_status(gpusvd: Gpusvd) -> None:
    gpusvd.start()  # Type=notify: `start` returns once READY=1 arrived
    props = gpusvd.m.show(UNIT, "ActiveState", "SubState", "StatusText", "Result")
    assert props["ActiveState"] == "active" and props["SubState"] == "running"
    assert props["StatusText"], props
    assert gpusvd.cli("health").returncode == 0
