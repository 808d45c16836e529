"""Start-up chores: the state dir's lock, the deadman's exit marker left by one run and
recorded by the next (a real process exits through it), and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.daemon.life import startup
from supervisor.daemon.requests.server import StartupError
from supervisor.daemon.store.database import Store


def test_a_second_lock_on_the_state_dir_is_refused(tmp_path: Path) -> None:
    fd = startup.lock_state_dir(tmp_path)
    try:
        with pytest.raises(StartupError) as refused:
            startup.lock_state_dir(tmp_path)
        assert str(refused.value) == f"another gpusvd is already using the state dir {tmp_path}"
    finally:
        os.close(fd)
    os.close(startup.lock_state_dir(tmp_path))  # released with its descriptor


def test_the_deadman_exits_at_once_and_leaves_a_marker(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from supervisor.daemon.life import startup\n"
        "try:\n"
        "    startup.deadman_exit(Path(sys.argv[1]))(3)\n"
        "finally:\n"
        "    print('a finally block ran')\n"  # os._exit: no unwinding
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3 and done.stdout == ""
    marker = json.loads((tmp_path / "last-exit.json").read_text())
    assert marker["kind"] == "deadman" and marker["code"] == 3
    assert isinstance(marker["at"], float)


async def test_the_next_start_records_the_marker_once(store: Store, tmp_path: Path) -> None:
    marker = tmp_path / "last-exit.json"
    marker.write_text(json.dumps({"kind": "deadman", "at": 1767322800.5, "code": 3}))
    await startup.record_previous_exit(store, tmp_path)
    assert not marker.exists()
    assert await store.daemon_events("deadman") == [
        {"kind": "deadman", "at": "2026-01-02T03:00:00.500Z", "code": 3}
    ]
    await startup.record_previous_exit(store, tmp_path)  # no marker: nothing more
    assert len(await store.daemon_events("deadman")) == 1


async def test_a_torn_marker_is_left_alone(store: Store, tmp_path: Path) -> None:
    (tmp_path / "last-exit.json").write_text('{"kind": "dead')
    await startup.record_previous_exit(store, tmp_path)
    assert await store.daemon_events("deadman") == []


def test_the_command_line() -> None:
    args = startup.parse_args(
        ["--state-dir", "/s", "--socket", "/s.sock", "--simulate-gpus", "2x8G",
         "--kernel-log", "off", "--log-format", "json", "--config", "/etc/x.toml"]
    )  # fmt: skip
    assert vars(args) == {
        "config": Path("/etc/x.toml"),
        "state_dir": "/s",
        "socket": "/s.sock",
        "simulate_gpus": "2x8G",
        "kernel_log": "off",
        "log_format": "json",
        "log_level": "info",
    }
    assert vars(startup.parse_args([])) == {
        "config": None,
        "state_dir": None,
        "socket": None,
        "simulate_gpus": None,
        "kernel_log": None,
        "log_format": None,
        "log_level": "info",
    }


def test_version_prints_and_exits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        startup.parse_args(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("gpusvd ") and out.strip() != "gpusvd"
