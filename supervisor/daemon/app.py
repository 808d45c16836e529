"""The composition root: builds the parts, reconciles, runs one task group, drains.

`run(config)` can be called in-process; `main()` is the `gpusvd` console script.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.abc
import structlog

from supervisor.core.jobs import FailureReason, Job, JobState
from supervisor.daemon import joblogs, logs, oom, reload, runner
from supervisor.daemon.api import Api
from supervisor.daemon.args import parse_args
from supervisor.daemon.attempts import AttemptRunner
from supervisor.daemon.clock import iso_from_epoch
from supervisor.daemon.config import Config, ConfigError, load
from supervisor.daemon.deadman import Deadman, abort_deadline_s
from supervisor.daemon.forensics import Forensics
from supervisor.daemon.gpu_monitor import GpuMonitor
from supervisor.daemon.hangs import HangWatcher
from supervisor.daemon.hooks import Hooks
from supervisor.daemon.recovery import reconcile
from supervisor.daemon.sampling import Sampler
from supervisor.daemon.scheduler import Running, Scheduler
from supervisor.daemon.server import Server, StartupError, connection_cap, preflight
from supervisor.daemon.store import Store, StoreOpenError
from supervisor.daemon.systemd import (
    HealthBoard,
    Notifier,
    StallDetector,
    status_line,
    watchdog_interval_s,
    watchdog_task,
)
from supervisor.daemon.telemetry import Telemetry
from supervisor.gpus import GpuError, open_backend
from supervisor.gpus.nvml_events import nvml_xid_sources
from supervisor.gpus.release import release_backend
from supervisor.wire.locations import config_path

log = structlog.get_logger("gpusvd")
EXIT_MARKER = "last-exit.json"
STATUS_INTERVAL_S = 5.0  # STATUS= refresh and the dispatch loop's check-in
SELF_PING_S = 10.0  # the server's check-in; as often as WATCHDOG=1 when that is sooner


@dataclass
class Parts:
    cfg: Config
    store: Store
    sched: Scheduler
    monitor: GpuMonitor
    attempts: AttemptRunner
    deadman: Deadman
    notifier: Notifier
    board: HealthBoard
    hangs: HangWatcher
    server: Server
    telemetry: Telemetry = field(init=False)
    api: Api = field(init=False)
    hooks: Hooks = field(init=False)
    load_config: Callable[[], Config] | None = None  # SIGHUP reads the config again


def _deadman_exit(state_dir: Path) -> Any:
    """Leave a marker for the next start (metrics and health report deadman fires), then
    leave without destructors: a drain cannot work when an abort is stuck."""

    def exit_(code: int) -> NoReturn:
        with contextlib.suppress(OSError):
            marker = state_dir / EXIT_MARKER
            marker.write_text(json.dumps({"kind": "deadman", "at": time.time(), "code": code}))
        os._exit(code)

    return exit_


async def _record_previous_exit(store: Store, state_dir: Path) -> None:
    marker = state_dir / EXIT_MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return
    await store.add_daemon_event(
        iso_from_epoch(float(data.get("at", time.time()))), data.get("kind", "unknown"), data
    )
    marker.unlink(missing_ok=True)
    log.warning("previous gpusvd exited through the deadman", exit_code=data.get("code"))


def _lock_state_dir(state: Path) -> int:
    """One daemon per state dir: a second one would reconcile, and so kill, the first
    one's running jobs. The lock is held until the process exits."""
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another gpusvd is already using the state dir {state}") from None
    return fd


async def build(cfg: Config) -> Parts:
    # Refuse before touching the state: a second daemon must not reconcile the first's jobs.
    preflight(cfg.socket, cfg.socket_group)
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    _lock_state_dir(state)
    (state / "logs").mkdir(exist_ok=True)
    store = await Store.open(state / "state.db")
    try:
        return await _assemble(cfg, store)
    except BaseException:  # the store's thread would keep a failed start alive
        with anyio.CancelScope(shield=True):
            await store.close()
        raise


async def _assemble(cfg: Config, store: Store) -> Parts:
    state = cfg.state_dir
    await _record_previous_exit(store, state)
    backend, warnings = open_backend(
        cfg.simulate_gpus, state, probe_deadline_s=cfg.gpus.probe_deadline_s, env=os.environ
    )
    for warning in warnings:
        log.warning(warning)
    forensics = Forensics()
    deadline = abort_deadline_s(cfg.deadman.abort_deadline_s, os.environ)
    deadman = Deadman(deadline, forensics=forensics, exit=_deadman_exit(state))
    deadman.start()
    sched = Scheduler(cfg, store)
    board = HealthBoard()
    monitor = GpuMonitor(
        backend,
        deadman.call,
        busy=lambda: bool(sched.running),
        on_change=lambda: _cards_changed(sched, monitor),
        beat=lambda: board.beat("gpu-monitor", time.monotonic()),
    )
    monitor.visible_by = cfg.gpus.visible_devices
    try:
        await monitor.discover()
    except GpuError as exc:  # e.g. a CUDA_VISIBLE_DEVICES naming no card of this host
        raise StartupError(str(exc)) from None
    sched.cards = monitor.admission_cards()
    hangs = HangWatcher(sched, monitor, cfg)
    hangs.more_sources = lambda: nvml_xid_sources(monitor.backend)
    hooks = Hooks(cfg.hooks, sched)
    sched.observers.append(hooks.on_change)
    hangs.reclassified = hooks.after_attempt
    sched.observers.append(
        lambda old, new: monitor.poke() if new.state is JobState.RUNNING else None
    )
    attempts = AttemptRunner(
        sched,
        logs_dir=state / "logs",
        visibility_env=monitor.visibility_env,
        abort=deadman.call,
        oom_evidence=hangs.oom_evidence,
        hang_evidence=hangs.hang_evidence,
        wait_for_fault=hangs.wait_for_fault,
        oom_kills_now=hangs.oom_kills_now,
        on_end=lambda job, r: _on_end(hangs, hooks, job, r),
    )
    hangs.attempts = attempts
    attempts.uuids_of = monitor.uuids_of
    sched.beat = lambda: board.beat("scheduler", time.monotonic())
    hangs.beat = lambda: board.beat("kernel-log", time.monotonic())
    sched.launch = attempts.launch
    forensics.provide(running_jobs=lambda: _running(sched), recent_kernel_lines=hangs.recent)
    api_parts: dict[str, Any] = {}
    server = Server(
        cfg.socket,
        lambda req, peer: api_parts["api"].handle(req, peer),
        mode=cfg.socket_mode,
        group=cfg.socket_group,
        max_connections=connection_cap(cfg.limits.max_connections),
        max_per_user=cfg.limits.max_connections_per_user,
        idle_timeout_s=cfg.limits.idle_timeout_s,
    )
    parts = Parts(cfg, store, sched, monitor, attempts, deadman, Notifier(), board, hangs, server)
    telemetry = parts.telemetry = Telemetry(parts)
    sched.observers.append(telemetry.metrics.observe_job)
    api = Api(
        cfg,
        sched,
        stop_job=lambda job_id: _cancel_running(parts, job_id),
        card_count=lambda: len(monitor.cards),
        card_vram_mb=lambda: max((c.vram_total_mb for c in monitor.cards), default=0),
        simple=telemetry.handlers(),
    )
    api_parts["api"] = parts.api = api
    parts.hooks = hooks
    server.admit = api.admit
    server.on_close = api.verbs.connection_closed
    telemetry.may_see = api.may_act
    telemetry.may_see_uid = lambda peer, uid: peer.uid == uid or api.is_admin(peer.uid)
    return parts


def _on_end(hangs: HangWatcher, hooks: Hooks, job: Job, r: Running) -> None:
    """After an attempt is recorded: hang bookkeeping, then the operator's hooks."""
    hangs.on_attempt_end(job, r)
    hooks.after_attempt(job, r.attempt)


def _cards_changed(sched: Scheduler, monitor: GpuMonitor) -> None:
    sched.cards = monitor.admission_cards()
    sched.poke()


def _running(sched: Scheduler) -> list[dict[str, Any]]:
    out = []
    for r in list(sched.running.values()):
        pids = [p.pid for p in r.handle.tree()] if r.handle else []
        out.append({"job_id": r.job_id, "pids": pids, "gpus": list(r.cards)})
    return out


async def _cancel_running(parts: Parts, job_id: int) -> None:
    r = parts.sched.running.get(job_id)
    if r is None:
        return
    assert parts.sched.tg is not None
    parts.sched.tg.start_soon(parts.attempts.stop, r, FailureReason.CANCELLED, None)


async def _drain(parts: Parts, scope: anyio.CancelScope) -> None:
    """Admit nothing more, stop running jobs as `interrupted` (requeued, uncharged), exit."""
    sched = parts.sched
    sched.draining = True
    parts.notifier.stopping()
    log.info("draining", running=len(sched.running))
    grace = parts.cfg.jobs.kill_grace_s
    parts.notifier.extend_timeout(grace + 30)
    async with anyio.create_task_group() as tg:
        for r in list(sched.running.values()):
            tg.start_soon(parts.attempts.stop, r, FailureReason.INTERRUPTED, None)
    with anyio.move_on_after(grace + 10):
        while sched.running:
            await anyio.sleep(0.05)
    log.info("drained")
    scope.cancel()


async def _signals(parts: Parts, scope: anyio.CancelScope) -> None:
    """Signals become events: the first SIGTERM/SIGINT starts the drain, a second stops at
    once; SIGHUP reloads the config."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reload.apply(parts)
                elif not parts.sched.draining:
                    log.info("signal: drain", signal=signal.Signals(signum).name)
                    tg.start_soon(_drain, parts, scope)
                else:
                    log.warning("second signal: stopping now")
                    for r in parts.sched.running.values():
                        if r.handle is not None:
                            with contextlib.suppress(Exception):
                                r.handle.signal_tree(signal.SIGKILL)
                    scope.cancel()


async def _status(parts: Parts) -> None:
    changed = anyio.Event()

    def on_change(_old: Job | None, _new: Job) -> None:
        changed.set()

    parts.sched.observers.append(on_change)
    while True:
        sched = parts.sched
        queued = len(sched.queue)
        cards = parts.monitor.cards
        parts.notifier.status(
            status_line(
                len(sched.running),
                queued,
                sched.held_counts(),
                sum(1 for c in cards if c.health == "ok"),
                len(cards),
                sched.draining,
            )
        )
        sched.poke()  # the dispatch loop checks in after the pass this wakes
        with anyio.move_on_after(STATUS_INTERVAL_S):
            await changed.wait()
        changed = anyio.Event()


async def _self_ping(parts: Parts, every_s: float) -> None:
    """The server checks in only by answering a real client on its own socket: a wedged
    accept loop or handler stops the pings to systemd. The server never refuses this
    client (its pid is the daemon's): a flood of others must not stop the check-in."""
    request = b'{"type":"ping"}\n'
    while True:
        with anyio.move_on_after(5.0):
            try:
                async with await anyio.connect_unix(parts.cfg.socket) as conn:
                    await conn.send(request)
                    if (await conn.receive()).startswith(b'{"ok":true'):
                        parts.board.beat("server", time.monotonic())
            except OSError as exc:
                log.warning("cannot reach our own socket", error=str(exc))
        await anyio.sleep(every_s)


async def serve(parts: Parts, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    """Start every service in order, then READY=1; returns when drained or cancelled."""
    sched, board = parts.sched, parts.board
    now = time.monotonic()
    services = ("scheduler", "server", "gpu-monitor", "kernel-log")
    for name, period in ((s, 30.0) for s in services):
        board.register(name, period, now)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            await tg.start(parts.store.run_writer)
            await reconcile(sched, parts.store)
            await tg.start(parts.deadman.run)
            await tg.start(sched.run)
            await tg.start(parts.monitor.run)
            await tg.start(parts.hangs.run)
            await tg.start(Sampler(sched, parts.attempts, parts.monitor, parts.hangs).run)
            await tg.start(parts.server.run)
            tg.start_soon(_signals, parts, scope)
            tg.start_soon(_status, parts)
            interval = watchdog_interval_s(os.environ)
            tg.start_soon(_self_ping, parts, min(SELF_PING_S, interval or SELF_PING_S))
            if interval is not None:
                await tg.start(watchdog_task_for(parts, interval))
            await tg.start(StallDetector().run)
            tg.start_soon(joblogs.retention_task, parts.cfg, lambda: set(parts.sched.jobs))
            if parts.cfg.metrics_listen:
                await tg.start(parts.telemetry.serve_metrics)
            parts.notifier.ready()
            log.info(
                "ready",
                socket=str(parts.cfg.socket),
                gpus=len(parts.monitor.cards),
                state_dir=str(parts.cfg.state_dir),
            )
            task_status.started()
    await parts.store.flush()


def watchdog_task_for(parts: Parts, interval: float) -> Any:
    async def task(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        await watchdog_task(parts.notifier, parts.board, interval, task_status=task_status)

    return task


def _pidfd_child_watcher() -> None:
    """Python 3.11's default child watcher starts a thread per child process (hooks, the
    journal reader); a pidfd watcher needs none. 3.12 does this by default."""
    if sys.version_info >= (3, 12):
        return
    import asyncio

    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


async def run(cfg: Config, load_config: Callable[[], Config] | None = None) -> int:
    _pidfd_child_watcher()
    if runner.become_subreaper():
        log.debug("child subreaper set")
    warning = oom.daemon_self_adjust()
    if warning:  # normal off systemd (no CAP_SYS_RESOURCE): worth a line, not a warning
        log.info(warning)
    parts = await build(cfg)
    parts.load_config = load_config
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(serve, parts)
    finally:
        parts.deadman.stop()
        with anyio.CancelScope(shield=True):
            await parts.store.close()
            await release_backend(parts.monitor.backend)
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    flags = {
        k: v
        for k, v in vars(args).items()
        if k in ("state_dir", "socket", "simulate_gpus", "kernel_log", "log_format")
        and v is not None
    }
    try:
        uid = os.geteuid()
        path = config_path(args.config, os.environ)
        cfg = load(path, flags=flags, env=os.environ, uid=uid)
        abort_deadline_s(cfg.deadman.abort_deadline_s, os.environ)
        logs.configure(cfg.log_format, args.log_level)
    except (ConfigError, ValueError) as exc:
        print(f"gpusvd: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        code = anyio.run(run, cfg, lambda: load(path, flags=flags, env=os.environ, uid=uid))
    except (StartupError, StoreOpenError) as exc:
        print(f"gpusvd: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
