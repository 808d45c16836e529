"""systemd integration: sd_notify on a real socket, the health board, the watchdog task,
the stall detector, and the unit file."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import CapturedCall, CapturingLogger

from supervisor.daemon.life.systemd import (
    LOOP,
    Notifier,
    StallDetector,
    status_line,
    watchdog_interval_s,
    watchdog_task,
)
from supervisor.daemon.liveness import HealthBoard

UNIT = Path(__file__).resolve().parents[3] / "systemd" / "gpusvd.service"
PATIENCE_S = 10.0


# -- a real notify socket -----------------------------------------------------------------


class NotifySocket:
    """The receiving end systemd would hold: an AF_UNIX datagram socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, timeout: float = PATIENCE_S) -> str | None:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(4096).decode()
        except TimeoutError:
            return None

    def drain(self) -> list[str]:
        messages = []
        while (message := self.recv(timeout=0.001)) is not None:
            messages.append(message)
        return messages

    async def arecv(self, timeout: float = PATIENCE_S) -> str | None:
        """Receive without blocking the event loop that runs the sender."""
        with anyio.move_on_after(timeout):
            await anyio.wait_readable(self.sock)
            return self.recv(timeout=0)
        return None


@pytest.fixture
def notify_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    # A short directory: AF_UNIX paths are limited to 108 bytes.
    with tempfile.TemporaryDirectory(prefix="sd", dir="/tmp") as tmp:
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        try:
            yield NotifySocket(sock)
        finally:
            sock.close()


def test_notifier_sends_each_message(notify_socket: NotifySocket) -> None:
    notifier = Notifier()
    assert notifier.enabled
    notifier.ready()
    notifier.status("1 running, 0 queued, GPUs 2/2 ok")
    notifier.status("1 running, 0 queued, GPUs 2/2 ok")  # unchanged: not sent again
    notifier.status("0 running, 0 queued, GPUs 2/2 ok")
    notifier.watchdog()
    notifier.extend_timeout(2.5)
    notifier.stopping()
    received = [notify_socket.recv() for _ in range(6)]
    assert received == [
        "READY=1",
        "STATUS=1 running, 0 queued, GPUs 2/2 ok",
        "STATUS=0 running, 0 queued, GPUs 2/2 ok",
        "WATCHDOG=1",
        "EXTEND_TIMEOUT_USEC=2500000",
        "STOPPING=1",
    ]
    assert notify_socket.drain() == []


def test_notifier_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"gpusv-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        Notifier().ready()
        sock.settimeout(PATIENCE_S)
        assert sock.recv(64) == b"READY=1"


def test_notifier_without_notify_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    notifier.ready()
    notifier.status("x")
    notifier.watchdog()
    notifier.stopping()


def test_extend_timeout_must_be_positive(notify_socket: NotifySocket) -> None:
    with pytest.raises(ValueError):
        Notifier().extend_timeout(0)


# -- watchdog_interval_s ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval_s(env, pid=4242) == expected


def test_watchdog_interval_defaults_to_our_pid() -> None:
    env = {"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval_s(env) == 0.5


# -- HealthBoard --------------------------------------------------------------------------


def test_board_reports_services_that_missed_their_period() -> None:
    board = HealthBoard()
    board.register("scheduler", 10.0)
    board.register("server", 5.0)
    assert board.stale(100.0) == ["scheduler", "server"]  # never beaten
    board.beat("scheduler", 100.0)
    board.beat("server", 100.0)
    assert board.healthy(105.0)  # exactly at the period still counts
    assert board.stale(105.5) == ["server"]
    assert not board.healthy(105.5)
    board.beat("server", 105.5)
    assert board.stale(110.5) == ["scheduler"]


def test_board_grace_period_and_unregister() -> None:
    board = HealthBoard()
    board.register("kernel-log", 30.0, now=0.0)
    assert board.healthy(29.0)
    assert board.stale(31.0) == ["kernel-log"]
    board.unregister("kernel-log")
    assert board.healthy(1000.0)
    assert "kernel-log" not in board


def test_board_rejects_unknown_beats_and_bad_periods() -> None:
    board = HealthBoard()
    with pytest.raises(KeyError, match="never registered"):
        board.beat("nobody", 1.0)
    with pytest.raises(ValueError):
        board.register("loop", 0)


# -- status_line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kw", "expected"),
    [
        ((3, 5, {"host_ram": 1}, 2, 2), {}, "3 running, 5 queued (1 held: host RAM), GPUs 2/2 ok"),
        ((0, 0, {}, 2, 2), {}, "0 running, 0 queued, GPUs 2/2 ok"),
        (
            (1, 4, {"host_ram": 0, "vram": 4}, 1, 2),
            {},
            "1 running, 4 queued (4 held: VRAM), GPUs 1/2 ok",
        ),
        (
            (2, 6, {"vram": 1, "host_ram": 2, "gpus": 2}, 2, 2),
            {},
            "2 running, 6 queued (5 held: 2 GPUs, 2 host RAM, 1 VRAM), GPUs 2/2 ok",
        ),
        ((1, 0, {}, 0, 0), {}, "1 running, 0 queued, no GPUs"),
        ((0, 1, {"cpu": 1}, 0, 0), {}, "0 running, 1 queued (1 held: CPU slots), no GPUs"),
        ((2, 1, {}, 2, 2), {"draining": True}, "draining: 2 running, 1 queued, GPUs 2/2 ok"),
    ],
)
def test_status_line(args: tuple[Any, ...], kw: dict[str, Any], expected: str) -> None:
    assert status_line(*args, **kw) == expected


# -- watchdog_task ------------------------------------------------------------------------


def _capturing() -> tuple[Any, CapturingLogger]:
    cap = CapturingLogger()
    return structlog.wrap_logger(cap, processors=[]), cap


async def _until(predicate: Callable[[], bool], what: str) -> None:
    with anyio.move_on_after(PATIENCE_S):
        while not predicate():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"gave up waiting for: {what}")


def _events(cap: CapturingLogger, method: str) -> list[CapturedCall]:
    return [c for c in list(cap.calls) if c.method_name == method]


async def _watchdogs(notify: NotifySocket, count: int) -> int:
    got = 0
    while got < count and (message := await notify.arecv()) is not None:
        got += message == "WATCHDOG=1"
    return got


async def test_watchdog_pings_only_while_every_service_checks_in(
    notify_socket: NotifySocket,
) -> None:
    board = HealthBoard()
    board.register("scheduler", 1.5, now=time.monotonic())  # stale after 1.5 s: load-proof
    log, cap = _capturing()
    beating = True

    async def scheduler() -> None:
        while True:
            if beating:
                board.beat("scheduler", time.monotonic())
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(scheduler)
        await tg.start(functools.partial(watchdog_task, log=log), Notifier(), board, 0.1)
        assert LOOP in board
        assert await _watchdogs(notify_socket, 3) == 3  # a steady cadence

        beating = False  # the scheduler is stuck from now on
        await _until(lambda: bool(_events(cap, "error")), "pings withheld")
        withheld = _events(cap, "error")
        assert withheld[0].kwargs["stale"] == ["scheduler"]
        notify_socket.drain()  # pings sent before the scheduler went stale
        assert await notify_socket.arecv(timeout=0.5) is None  # five intervals, no ping

        beating = True
        assert await _watchdogs(notify_socket, 1) == 1
        await _until(lambda: bool(_events(cap, "info")), "pings resumed")
        assert len(_events(cap, "error")) == 1  # logged once for the whole episode
        tg.cancel_scope.cancel()


# -- StallDetector ------------------------------------------------------------------------


class SignallingLogger(CapturingLogger):
    """Captures like CapturingLogger and lets a blocked thread wait for a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.warned = threading.Event()

    def warning(self, *args: Any, **kw: Any) -> None:
        self.calls.append(CapturedCall("warning", args, kw))
        self.warned.set()


async def test_stall_detector_logs_every_stack_once_per_stall() -> None:
    cap = SignallingLogger()
    log = structlog.wrap_logger(cap, processors=[])
    detector = StallDetector(0.3, log=log)
    async with anyio.create_task_group() as tg:
        await tg.start(detector.run)
        await asyncio.sleep(0.2)  # a few ticks

        # Block the loop thread itself, until the detector has noticed (or give up).
        noticed = cap.warned.wait(PATIENCE_S)

        assert noticed, "the stall was not reported"
        await _until(lambda: bool(_events(cap, "info")), "loop turning again")
        tg.cancel_scope.cancel()

    (warning,) = _events(cap, "warning")
    assert warning.kwargs["event"] == "event loop stalled"
    assert warning.kwargs["stalled_s"] >= 0.3
    stacks = warning.kwargs["stacks"]
    assert "<-- the event loop" in stacks
    assert "test_stall_detector_logs_every_stack_once_per_stall" in stacks
    (resumed,) = _events(cap, "info")
    assert resumed.kwargs["event"] == "event loop turning again"


def test_stall_detector_stops_cleanly() -> None:
    detector = StallDetector(30.0)
    detector.start()
    detector.stop()
    assert not any(t.name == "stall-detector" for t in threading.enumerate())


# -- the unit file ------------------------------------------------------------------------


def _unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
        else:
            key, _, value = line.partition("=")
            sections[current].append((key.strip(), value.strip()))
    return sections


REQUIRED = {
    "Unit": {"StartLimitIntervalSec": "600", "StartLimitBurst": "4"},
    "Service": {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": "/opt/gpusv/bin/gpusvd",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "RestartSec": "5",
        "TimeoutStartSec": "90",
        "TimeoutStopSec": "120",
        "KillMode": "process",
        "OOMScoreAdjust": "-900",
        "OOMPolicy": "continue",
        "ManagedOOMPreference": "avoid",
        "Delegate": "yes",
        "StateDirectory": "gpusvd",
        "StateDirectoryMode": "0700",
        "RuntimeDirectory": "gpusvd",
        "RuntimeDirectoryMode": "0755",
    },
    "Install": {"WantedBy": "multi-user.target"},
}


def test_unit_sets_what_the_daemon_relies_on() -> None:
    sections = _unit_sections(UNIT.read_text())
    for section, required in REQUIRED.items():
        present = dict(sections[section])
        for key, value in required.items():
            assert present.get(key) == value, f"[{section}] {key}={value}"
    service_keys = {key for key, _ in sections["Service"]}
    # In [Service] these would be ignored (or mean the old, different key).
    assert not service_keys & {"StartLimitIntervalSec", "StartLimitBurst", "StartLimitInterval"}
    # Exit 70 must restart: on-failure covers it unless it is excluded.
    prevented = dict(sections["Service"]).get("RestartPreventExitStatus", "").split()
    assert "70" not in prevented


def test_every_unit_line_has_a_comment_above_it() -> None:
    previous = ""
    for number, raw in enumerate(UNIT.read_text().splitlines(), 1):
        line = raw.strip()
        if line and line[0] not in "#;[":
            assert previous.startswith("#"), f"line {number} ({line}) has no comment above it"
        previous = line


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify insists that ExecStart= exists; the rest of the unit is checked as shipped.
    unit = tmp_path / "gpusvd.service"
    text = UNIT.read_text().replace("ExecStart=/opt/gpusv/bin/gpusvd", "ExecStart=/bin/true")
    unit.write_text(text)
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0 and "gpusvd.service" not in output:
        pytest.skip(f"systemd-analyze verify cannot run here: {output.strip()[:200]}")
    # verify exits 0 even for unknown keys and bad values; it only warns, naming the file.
    assert result.returncode == 0, output
    assert "gpusvd.service" not in output, output
