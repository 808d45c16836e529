"""systemd integration: sd_notify (READY, STATUS, WATCHDOG, STOPPING) and liveness.

WATCHDOG=1 is sent only while every critical service has checked in within its period,
so a stuck scheduler, server or monitor, not only a stuck event loop, makes systemd
restart the daemon. A stalled loop is also reported, with every thread's stack, by a
thread that does not depend on the loop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import anyio.abc
import sdnotify
import structlog
from structlog.typing import FilteringBoundLogger

from supervisor.daemon.life.forensics import thread_stacks
from supervisor.daemon.liveness import HealthBoard

LOOP = "loop"
CRITICAL_SERVICES = (LOOP, "scheduler", "server", "gpu-monitor", "kernel-log")

# Hold reasons (admission.HoldReason) as the status line names them.
_HELD_LABELS = {
    "host_ram": "host RAM",
    "vram": "VRAM",
    "gpus": "GPUs",
    "cpu": "CPU slots",
    "cards": "their cards",
}


def _logger(log: FilteringBoundLogger | None) -> FilteringBoundLogger:
    return log or structlog.get_logger("gpusvd.systemd")


class Notifier:
    """sd_notify messages to systemd; a no-op when NOTIFY_SOCKET is unset."""

    def __init__(self, *, log: FilteringBoundLogger | None = None) -> None:
        self._log = _logger(log)
        self._last_status: str | None = None
        self._sd: sdnotify.SystemdNotifier | None = None
        address = os.environ.get("NOTIFY_SOCKET")
        if not address:
            return
        # sdnotify reads NOTIFY_SOCKET (with "@" abstract addresses) when constructed.
        self._sd = sdnotify.SystemdNotifier()
        if self._sd.socket is None:
            self._log.warning("NOTIFY_SOCKET is set but cannot be reached", address=address)
            return
        # A full receive queue must drop a message, never block the event loop.
        self._sd.socket.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sd is not None and self._sd.socket is not None

    def ready(self) -> None:
        self._send("READY=1")

    def status(self, line: str) -> None:
        """STATUS=line, sent only when it differs from the last one."""
        if line != self._last_status:
            self._last_status = line
            self._send(f"STATUS={line}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for more time to start or stop (EXTEND_TIMEOUT_USEC)."""
        if not seconds > 0:
            raise ValueError(f"timeout extension must be positive, got {seconds!r}")
        self._send(f"EXTEND_TIMEOUT_USEC={round(seconds * 1_000_000)}")

    def _send(self, message: str) -> None:
        if self._sd is not None:
            self._sd.notify(message)


def watchdog_interval_s(env: Mapping[str, str], *, pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1: half of systemd's WatchdogSec; None when it is off."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    watchdog_pid = env.get("WATCHDOG_PID")
    if watchdog_pid:
        try:
            if int(watchdog_pid) != (os.getpid() if pid is None else pid):
                return None  # the variable was meant for a parent and leaked to us
        except ValueError:
            return None
    return usec / 2_000_000


def status_line(
    running: int,
    queued: int,
    held: dict[str, int],
    gpus_ok: int,
    gpus_total: int,
    draining: bool = False,
) -> str:
    """The STATUS= line `systemctl status` shows.

    E.g. "3 running, 5 queued (1 held: host RAM), GPUs 2/2 ok"; `held` counts queued
    jobs by hold reason.
    """
    queue = f"{queued} queued"
    reasons = {reason: n for reason, n in held.items() if n > 0}
    if reasons:
        total = sum(reasons.values())
        if len(reasons) == 1:
            (reason,) = reasons
            detail = _HELD_LABELS.get(reason, reason)
        else:
            ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
            detail = ", ".join(f"{n} {_HELD_LABELS.get(r, r)}" for r, n in ranked)
        queue += f" ({total} held: {detail})"
    gpus = f"GPUs {gpus_ok}/{gpus_total} ok" if gpus_total else "no GPUs"
    line = f"{running} running, {queue}, {gpus}"
    return f"draining: {line}" if draining else line


async def watchdog_task(
    notifier: Notifier,
    board: HealthBoard,
    interval_s: float,
    *,
    log: FilteringBoundLogger | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Beat "loop" every turn; send WATCHDOG=1 each interval only while the board is healthy."""
    log = _logger(log)
    if LOOP not in board:
        board.register(LOOP, 2 * interval_s)
    task_status.started()
    reported: list[str] = []
    while True:
        now = time.monotonic()
        board.beat(LOOP, now)
        stale = board.stale(now)
        if stale != reported:
            if stale:
                log.error("watchdog pings withheld: services not checking in", stale=stale)
            else:
                log.info("all services checking in again; watchdog pings resumed")
            reported = stale
        if not stale:
            notifier.watchdog()
        await anyio.sleep(interval_s)


class StallDetector:
    """Logs every thread's stack, once per stall, when the event loop stops turning."""

    def __init__(
        self,
        threshold_s: float = 5.0,
        *,
        log: FilteringBoundLogger | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold_s = threshold_s
        self._log = _logger(log)
        self._now = now
        self._last = now()
        self._loop_ident: int | None = None
        self._ticked = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """Called by the loop: it is turning."""
        self._last = self._now()
        self._loop_ident = threading.get_ident()
        self._ticked.set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._last = self._now()
        self._stopped.clear()
        self._thread = threading.Thread(target=self._watch, name="stall-detector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        self._stopped.set()
        self._ticked.set()  # wakes a watcher waiting for the stall to end
        if thread is not None:
            thread.join(timeout=2.0)

    async def run(
        self,
        *,
        interval_s: float | None = None,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the detector and tick it from the loop (default: 4 ticks per threshold)."""
        self.start()
        try:
            task_status.started()
            while True:
                self.tick()
                await anyio.sleep(interval_s or self.threshold_s / 4)
        finally:
            self.stop()

    def _watch(self) -> None:
        while not self._stopped.is_set():
            self._ticked.clear()
            since = self._now() - self._last
            if since < self.threshold_s:
                self._stopped.wait(self.threshold_s - since)
                continue
            stalled_from = self._last
            self._report(since)
            self._ticked.wait()  # one report per stall: the next one needs a tick first
            if not self._stopped.is_set():
                gap = round(self._last - stalled_from, 1)
                self._log.info("event loop turning again", stalled_s=gap)

    def _report(self, since: float) -> None:
        marks = {self._loop_ident: "the event loop"} if self._loop_ident is not None else {}
        self._log.warning(
            "event loop stalled",
            stalled_s=round(since, 1),
            threshold_s=self.threshold_s,
            stacks=thread_stacks(marks),
        )


async def self_ping(socket: Path, board: HealthBoard, every_s: float) -> None:
    """The server checks in only by answering a real client on its own socket: a wedged
    accept loop or handler stops the pings to systemd. The server never refuses this
    client (its pid is the daemon's): a flood of others must not stop the check-in."""
    request = b'{"type":"ping"}\n'
    while True:
        with anyio.move_on_after(5.0):
            try:
                async with await anyio.connect_unix(socket) as conn:
                    await conn.send(request)
                    if (await conn.receive()).startswith(b'{"ok":true'):
                        board.beat("server", time.monotonic())
            except OSError as exc:
                _logger(None).warning("cannot reach our own socket", error=str(exc))
        await anyio.sleep(every_s)
