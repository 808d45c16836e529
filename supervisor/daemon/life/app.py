"""The composition root: builds the parts, reconciles, runs one task group, drains.

`run(config)` can be called in-process; `main()` is the `gpusvd` console script.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import anyio.abc
import structlog

from supervisor.core.commands import Changed
from supervisor.core.jobs import JobState
from supervisor.daemon import cgroups
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import Config, ConfigError, load
from supervisor.daemon.dispatcher import CardsChanged, Dispatcher
from supervisor.daemon.engine import Engine
from supervisor.daemon.event_log import JobLines
from supervisor.daemon.life import log_setup as logs
from supervisor.daemon.life import shutdown
from supervisor.daemon.life.deadman import Deadman, abort_deadline_s
from supervisor.daemon.life.forensics import Forensics
from supervisor.daemon.life.heap import IdleTrim, return_free_memory
from supervisor.daemon.life.parts import DaemonPhase, Parts
from supervisor.daemon.life.recovery import reconcile
from supervisor.daemon.life.space import wait_for_space
from supervisor.daemon.life.startup import (
    deadman_exit,
    lock_state_dir,
    parse_args,
    pidfd_child_watcher,
    record_previous_exit,
)
from supervisor.daemon.life.systemd import (
    Notifier,
    StallDetector,
    self_ping,
    status_line,
    watchdog_interval_s,
    watchdog_task,
)
from supervisor.daemon.liveness import HealthBoard
from supervisor.daemon.requests.access import Access
from supervisor.daemon.requests.handlers import Api
from supervisor.daemon.requests.server import Server, StartupError, connection_cap, preflight
from supervisor.daemon.requests.telemetry import Telemetry
from supervisor.daemon.running import oom_scores as oom
from supervisor.daemon.running.keepers import Keepers, cgroup_tag, keeper_name
from supervisor.daemon.running.runner import Runner
from supervisor.daemon.store import output_files as joblogs
from supervisor.daemon.store.database import Store, StoreOpenError
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.watch.gpu_handover import handover_signals
from supervisor.daemon.watch.gpu_monitor import GpuMonitor
from supervisor.daemon.watch.hangs import HangWatcher
from supervisor.daemon.watch.hooks import Hooks
from supervisor.daemon.watch.memory import available_mb, read_meminfo
from supervisor.daemon.watch.sampling import Sampler
from supervisor.gpus import GpuError, open_backend
from supervisor.gpus.nvml_events import nvml_xid_sources
from supervisor.gpus.release import release_backend
from supervisor.wire.locations import config_path

log = structlog.get_logger("gpusvd")
STATUS_INTERVAL_S = 5.0  # STATUS= refresh and the dispatch loop's check-in
STATUS_COALESCE_S = 0.25  # STATUS= follows job changes at most this often
SELF_PING_S = 10.0  # the server's check-in; as often as WATCHDOG=1 when that is sooner


async def build(cfg: Config, load_config: Callable[[], Config] | None = None) -> Parts:
    # Refuse before touching the state: a second daemon must not reconcile the first's jobs.
    preflight(cfg.socket, cfg.socket_group)
    state = cfg.state_dir
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    lock_state_dir(state)
    joblogs.logs_dir(state).mkdir(exist_ok=True)
    await wait_for_space(
        state,
        Notifier(),
        lambda handler: Server(cfg.socket, handler, mode=cfg.socket_mode, group=cfg.socket_group),
    )
    store = await Store.open(state / "state.db")
    try:
        return await _assemble(cfg, store, load_config)
    except BaseException:  # the store's thread would keep a failed start alive
        with anyio.CancelScope(shield=True):
            await store.close()
        raise


async def _assemble(cfg: Config, store: Store, load_config: Callable[[], Config] | None) -> Parts:
    """Every part, constructed in dependency order; none is changed after construction."""
    state = cfg.state_dir
    await record_previous_exit(store, state)
    backend, warnings = open_backend(
        cfg.simulate_gpus, state, probe_deadline_s=cfg.gpus.probe_deadline_s, env=os.environ
    )
    for warning in warnings:
        log.warning(warning)
    forensics = Forensics()
    deadline = abort_deadline_s(cfg.deadman.abort_deadline_s, os.environ)
    deadman = Deadman(deadline, forensics=forensics, exit=deadman_exit(state))
    deadman.start()
    board = HealthBoard()
    broker = Broker()
    engine = Engine(store, broker, lines=JobLines(cfg.log_job_lines_per_s))
    book = MemoryBook(store, broker, cfg.host_memory.margin)
    monitor = GpuMonitor(
        backend,
        deadman.call,
        busy=lambda: bool(engine.table.live),
        on_change=lambda: broker.publish(CardsChanged()),
        beat=lambda: board.beat("gpu-monitor", time.monotonic()),
        visible_by=cfg.gpus.visible_devices,
    )
    try:
        await monitor.discover()
    except GpuError as exc:  # e.g. a CUDA_VISIBLE_DEVICES naming no card of this host
        raise StartupError(str(exc)) from None
    broker.subscribe(
        Changed, lambda ev: monitor.poke() if ev.new.state is JobState.RUNNING else None
    )
    mem_total_mb = read_meminfo().total_mb  # capped at our cgroup's limit, read once
    hangs = HangWatcher(
        cfg,
        engine,
        broker,
        monitor,
        mem_total_mb=mem_total_mb,
        beat=lambda: board.beat("kernel-log", time.monotonic()),
        more_sources=lambda: nvml_xid_sources(monitor.backend),
    )

    def keepers_changed() -> None:  # a keeper stopped answering, or answers again
        monitor.unanswered = keepers.watch.blocked_cards()
        broker.publish(CardsChanged())

    keepers = Keepers(
        state,
        *cgroups.keeper_roots(cgroup_tag(state)),
        silent_after_s=cfg.jobs.keeper_silent_s,
        on_change=keepers_changed,
    )
    runner = Runner(
        cfg,
        engine,
        broker,
        hangs,
        monitor,
        logs_dir=joblogs.logs_dir(state),
        abort=deadman.call,
        keepers=keepers,
    )
    dispatcher = Dispatcher(
        cfg,
        engine,
        book,
        broker,
        cards=monitor.admission_cards,
        rss_mb=runner.rss_mb,
        mem_total_mb=mem_total_mb,
        available_mb=available_mb,
        uuids_of=monitor.uuids_of,
        beat=lambda: board.beat("scheduler", time.monotonic()),
        can_follow=lambda cards: keepers.can(keeper_name(cards), "after"),
        can_chain=lambda cards: keepers.can(keeper_name(cards), "after_waiting"),
        drop_ahead=runner.drop_ahead,
    )
    hooks = Hooks(cfg.hooks, book, broker)
    forensics.provide(running_jobs=runner.running_json, recent_kernel_lines=hangs.recent)
    access = Access(cfg.admin_group)
    telemetry = Telemetry(cfg, engine, dispatcher, runner, monitor, board, access)
    broker.subscribe(Changed, lambda ev: telemetry.metrics.observe_job(ev.old, ev.new))
    api = Api(
        cfg,
        engine,
        book,
        access,
        broker,
        dispatcher=dispatcher,
        live_rss=runner.live_rss,
        card_count=lambda: len(monitor.cards),
        card_vram_mb=lambda: max((c.vram_total_mb for c in monitor.cards), default=0),
        simple=telemetry.handlers(),
    )
    server = Server(
        cfg.socket,
        api.handle,
        mode=cfg.socket_mode,
        group=cfg.socket_group,
        max_connections=connection_cap(cfg.limits.max_connections),
        max_per_user=cfg.limits.max_connections_per_user,
        idle_timeout_s=cfg.limits.idle_timeout_s,
        admit=access.admit,
        on_close=api.verbs.connection_closed,
        kept=api.verbs.holds_run_jobs,
        after_big=return_free_memory,
    )
    return Parts(
        cfg,
        store,
        broker,
        engine,
        book,
        monitor,
        dispatcher,
        hangs,
        runner,
        keepers,
        hooks,
        deadman,
        Notifier(),
        board,
        telemetry,
        server,
        access,
        api,
        load_config=load_config,
    )


async def _status(parts: Parts) -> None:
    changed = anyio.Event()

    def on_change(_ev: Changed) -> None:
        changed.set()

    parts.broker.subscribe(Changed, on_change)
    table = parts.engine.table

    def trim() -> None:
        table.refit()
        return_free_memory()

    idle = IdleTrim(trim)
    while True:
        cards = parts.monitor.cards
        parts.notifier.status(
            status_line(
                len(table.live),
                len(table.queue),
                table.held_counts(),
                sum(1 for c in cards if c.health == "ok"),
                len(cards),
                parts.dispatcher.draining,
            )
        )
        parts.dispatcher.poke()  # the dispatch loop checks in after the pass this wakes
        idle.seen(len(table.live) + len(table.queue))
        with anyio.move_on_after(STATUS_INTERVAL_S):
            await changed.wait()
            await anyio.sleep(STATUS_COALESCE_S)  # a flood of changes: one line for them all
        changed = anyio.Event()


async def serve(parts: Parts, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    """Start every service in order, then READY=1; returns when drained or cancelled."""
    board = parts.board
    now = time.monotonic()
    services = ("scheduler", "server", "gpu-monitor", "kernel-log")
    for name, period in ((s, 30.0) for s in services):
        board.register(name, period, now)
    with anyio.CancelScope() as scope:
        async with parts.keepers, anyio.create_task_group() as tg:
            await tg.start(parts.store.run_writer)
            await reconcile(parts.engine, parts.store, parts.book, parts.keepers, parts.runner)
            await tg.start(parts.deadman.run)
            await tg.start(parts.hooks.run)
            await tg.start(parts.runner.run)
            await tg.start(parts.keepers.watch.run)
            await tg.start(parts.dispatcher.run)
            await tg.start(parts.monitor.run)
            tg.start_soon(handover_signals, parts.monitor)
            await tg.start(parts.hangs.run)
            sampler = Sampler(
                parts.cfg, parts.engine, parts.runner, parts.dispatcher, parts.monitor, parts.hangs
            )
            await tg.start(sampler.run)
            await tg.start(parts.server.run)
            tg.start_soon(shutdown.signals, parts, scope)
            tg.start_soon(_status, parts)
            interval = watchdog_interval_s(os.environ)
            every = min(SELF_PING_S, interval or SELF_PING_S)
            tg.start_soon(self_ping, parts.cfg.socket, parts.board, every)
            if interval is not None:
                await tg.start(watchdog_task_for(parts, interval))
            await tg.start(StallDetector().run)
            tg.start_soon(joblogs.retention_task, parts.cfg, lambda: set(parts.engine.table.jobs))
            if parts.cfg.metrics_listen:
                await tg.start(parts.telemetry.serve_metrics)
            parts.phase = DaemonPhase.SERVING
            return_free_memory()
            parts.notifier.ready()
            log.info(
                "ready",
                socket=str(parts.cfg.socket),
                gpus=len(parts.monitor.cards),
                state_dir=str(parts.cfg.state_dir),
            )
            task_status.started()
    parts.phase = DaemonPhase.STOPPED
    await parts.store.flush()


def watchdog_task_for(parts: Parts, interval: float) -> Any:
    async def task(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        await watchdog_task(parts.notifier, parts.board, interval, task_status=task_status)

    return task


async def run(cfg: Config, load_config: Callable[[], Config] | None = None) -> int:
    pidfd_child_watcher()
    cgroups.settle_delegated()  # under Delegate=yes: into a leaf, job cgroups beside it
    warning = oom.daemon_self_adjust()
    if warning:  # normal off systemd (no CAP_SYS_RESOURCE): worth a line, not a warning
        log.info(warning)
    parts = await build(cfg, load_config)
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
