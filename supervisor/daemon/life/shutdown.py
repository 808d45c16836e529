"""How the daemon ends: a stop drains the jobs (stopped, recorded `interrupted`, queued
again); a restart (`systemctl restart`, SIGQUIT) leaves them to their keepers for the next
daemon to take back; a second signal stops at once."""

from __future__ import annotations

import signal

import anyio
import structlog

from supervisor.core.commands import Changed, Stop
from supervisor.core.jobs import FailureReason
from supervisor.core.table import claimed_ahead
from supervisor.daemon.life import leaving, reload
from supervisor.daemon.life.parts import DaemonPhase, Parts
from supervisor.daemon.running.keepers import Keepers

log = structlog.get_logger("gpusvd")

KEEPERS_EXIT_S = 10.0  # for the keepers let go by a drain to exit


async def _drain(parts: Parts, scope: anyio.CancelScope) -> None:
    """Admit nothing more, stop running jobs as `interrupted` (requeued, uncharged), exit."""
    parts.phase = DaemonPhase.DRAINING
    parts.dispatcher.drain()
    parts.notifier.stopping()
    parts.server.leave_for_good()
    table = parts.engine.table
    log.info("draining", running=len(table.live))
    grace = parts.cfg.jobs.kill_grace_s
    parts.notifier.extend_timeout(grace + 30)
    idle = anyio.Event()

    def check(_ev: Changed) -> None:
        if not table.live:
            idle.set()

    parts.broker.subscribe(Changed, check)
    for job_id, _ in claimed_ahead(table.live):  # before the jobs they wait behind
        await parts.engine.do(Stop(job_id, FailureReason.INTERRUPTED))
    await parts.runner.ahead_answered()
    for job_id in list(table.live):
        await parts.engine.do(Stop(job_id, FailureReason.INTERRUPTED))
    with anyio.move_on_after(grace + 10):
        if table.live:
            await idle.wait()
        while parts.runner.procs:  # each end acknowledged to its keeper
            await anyio.sleep(0.02)
    if await parts.keepers.shutdown_idle():  # a stopped daemon leaves no keeper behind
        with anyio.move_on_after(KEEPERS_EXIT_S):
            await parts.keepers.all_closed()
        _remove_groups(parts.keepers)
    parts.engine.lines.flush()  # the last second's job lines left out, summed up
    log.info("drained")
    scope.cancel()


def _remove_groups(keepers: Keepers) -> None:
    """The keepers' group, emptied by the keepers let go (each removes its roots before
    it exits): where no systemd trims the unit's tree after a stop (a shell, a
    container), a stopped daemon leaves no cgroup behind either."""
    for group in (keepers.cgroup2, keepers.memcg):
        if group is None:
            continue
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.info("cgroup left in place", cgroup=str(group), why=exc.strerror)


async def _leave(parts: Parts, scope: anyio.CancelScope, why: str) -> None:
    """Exit without touching running jobs: their keepers hold them and the next daemon
    takes them back (a restart, an upgrade). Everything they need is already durable."""
    parts.phase = DaemonPhase.DRAINING
    parts.dispatcher.drain()
    parts.notifier.stopping()
    parts.engine.lines.flush()
    log.info(
        "leaving: running jobs stay with their keepers", why=why, running=len(parts.runner.procs)
    )
    scope.cancel()


async def _on_stop_signal(parts: Parts, scope: anyio.CancelScope, signum: int) -> None:
    name = signal.Signals(signum).name
    if signum == signal.SIGQUIT:
        await _leave(parts, scope, name)
    elif await anyio.to_thread.run_sync(leaving.restarting):
        await _leave(parts, scope, f"{name} from systemctl restart")
    else:
        log.info("signal: drain", signal=name)
        await _drain(parts, scope)


async def signals(parts: Parts, scope: anyio.CancelScope) -> None:
    """Signals become events: the first SIGTERM/SIGINT drains (or, under `systemctl
    restart`, leaves the jobs to their keepers), a second stops at once; SIGQUIT leaves;
    SIGHUP reloads the config."""
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
    with anyio.open_signal_receiver(*stops, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reload.apply(parts)
                elif parts.phase is not DaemonPhase.DRAINING:
                    parts.phase = DaemonPhase.DRAINING
                    tg.start_soon(_on_stop_signal, parts, scope, signum)
                else:
                    log.warning("second signal: stopping now")
                    parts.runner.kill_all_now()
                    scope.cancel()
