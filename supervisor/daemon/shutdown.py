"""How the daemon ends: a stop drains the jobs (stopped, recorded `interrupted`, queued
again); a restart (`systemctl restart`, SIGQUIT) leaves them to their keepers for the next
daemon to take back; a second signal stops at once."""

from __future__ import annotations

import errno
import signal
from pathlib import Path

import anyio
import structlog

from supervisor.core.commands import Changed, Stop
from supervisor.core.jobs import FailureReason
from supervisor.daemon import leaving, reload
from supervisor.daemon.keepers import Keepers
from supervisor.daemon.parts import Parts, Phase

log = structlog.get_logger("gpusvd")

GROUP_WAIT_S = 10.0  # for the keepers let go by a drain to exit


async def _drain(parts: Parts, scope: anyio.CancelScope) -> None:
    """Admit nothing more, stop running jobs as `interrupted` (requeued, uncharged), exit."""
    parts.phase = Phase.DRAINING
    parts.dispatcher.drain()
    parts.notifier.stopping()
    table = parts.engine.table
    log.info("draining", running=len(table.live))
    grace = parts.cfg.jobs.kill_grace_s
    parts.notifier.extend_timeout(grace + 30)
    idle = anyio.Event()

    def check(_ev: Changed) -> None:
        if not table.live:
            idle.set()

    parts.broker.subscribe(Changed, check)
    for job_id, _ in parts.dispatcher.waiting_ahead():  # before the jobs they wait behind
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
        await _remove_emptied(parts.keepers)
    parts.engine.lines.flush()  # the last second's job lines left out, summed up
    log.info("drained")
    scope.cancel()


async def _remove_emptied(keepers: Keepers) -> None:
    """The keepers' group, once the keepers let go have removed their roots in it (each
    before it exits, a few milliseconds after its answer): where no systemd trims the
    unit's tree after a stop (a shell, a container), a stopped daemon leaves no cgroup
    behind either."""
    waiting = [g for g in (keepers.cgroup2, keepers.memcg) if g is not None]
    deadline = anyio.current_time() + GROUP_WAIT_S
    while waiting:
        exited = keepers.all_gone()  # before the try: after it, one more try decides
        waiting = [g for g in waiting if not _removed(g)]
        if exited or anyio.current_time() > deadline:
            break
        await anyio.sleep(0.01)
    for group in waiting:
        log.info("cgroup left in place: not empty", cgroup=str(group))


def _removed(group: Path) -> bool:
    try:
        group.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EBUSY):
            return False
        log.info("cgroup left in place", cgroup=str(group), why=exc.strerror)
    return True


async def _leave(parts: Parts, scope: anyio.CancelScope, why: str) -> None:
    """Exit without touching running jobs: their keepers hold them and the next daemon
    takes them back (a restart, an upgrade). Everything they need is already durable."""
    parts.phase = Phase.DRAINING
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
                elif parts.phase is not Phase.DRAINING:
                    parts.phase = Phase.DRAINING
                    tg.start_soon(_on_stop_signal, parts, scope, signum)
                else:
                    log.warning("second signal: stopping now")
                    parts.runner.kill_all_now()
                    scope.cancel()
