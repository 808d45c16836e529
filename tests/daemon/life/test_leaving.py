"""Stop or restart: the unit is read from /proc/self/cgroup, systemd's job from
`systemctl list-jobs`; a restart (only) leaves the jobs to their keepers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.daemon.life import leaving


@pytest.mark.parametrize(
    ("text", "unit"),
    [
        ("0::/system.slice/gpusvd.service\n", "gpusvd.service"),
        ("0::/system.slice/gpusvd.service/daemon\n", "gpusvd.service"),  # Delegate=yes leaf
        ("0::/system.slice/gpu@a.service/gpusvd-2.service/x\n", "gpusvd-2.service"),
        ("12:memory:/system.slice/other.service\n0::/user.slice/session-3.scope\n", None),
        ("0::/\n", None),
        ("", None),
    ],
)
def test_unit_of(text: str, unit: str | None) -> None:
    assert leaving.unit_of(text) == unit


LIST_JOBS = """\
 73 gpusvd.service        restart running
 75 nginx.service         stop    waiting
 76 gpusvd-b.service      start   waiting
"""


@pytest.mark.parametrize(
    ("unit", "kind"),
    [
        ("gpusvd.service", "restart"),
        ("nginx.service", "stop"),
        ("gpusvd-b.service", "start"),
        ("gpusvd-c.service", None),
    ],
)
def test_pending_job(unit: str, kind: str | None) -> None:
    assert leaving.pending_job(LIST_JOBS, unit) == kind
    assert leaving.pending_job("", unit) is None


def _systemctl(tmp_path: Path, output: str) -> dict[str, str]:
    """A systemctl that prints what systemd would: systemd is not PID 1 here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}OUT\n")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "INVOCATION_ID": "1" * 32}


@pytest.mark.parametrize(
    ("job", "restarting"),
    [("restart", True), ("try-restart", True), ("stop", False), ("start", False)],
)
def test_restarting_asks_systemd_about_our_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: str, restarting: bool
) -> None:
    env = _systemctl(tmp_path, f"7 gpusvd-b.service {job} running\n9 gpusvd.service stop x\n")
    monkeypatch.setenv("PATH", env["PATH"])
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/gpusvd-b.service/daemon\n")
    assert leaving.restarting(env, cgroup) is restarting


def test_off_systemd_or_without_an_answer_a_stop_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _systemctl(tmp_path, "7 gpusvd.service restart running\n")
    monkeypatch.setenv("PATH", env["PATH"])
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/\n")  # not in a unit's cgroup: the default unit name
    assert leaving.restarting(env, cgroup) is True
    assert leaving.restarting({"PATH": env["PATH"]}, cgroup) is False  # no INVOCATION_ID
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no systemctl at all
    assert leaving.restarting({"INVOCATION_ID": "x"}, cgroup) is False
