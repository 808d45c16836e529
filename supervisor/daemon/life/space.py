"""Start-up on a full state filesystem: wait for space instead of failing.

SQLite cannot open a database in WAL mode without room for its -wal and -shm files, and
reports that as a "disk I/O error", which reads like a damaged database. A full disk is
not a damaged database: the daemon says which it is, waits (telling systemd, so that
neither the start timeout nor the start limit gives up on it), and starts by itself
once space is back. Meanwhile its socket answers every request with the `storage` error,
so that a client hears why nothing is done instead of "gpusvd is not running"."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.daemon.life.systemd import Notifier
from supervisor.daemon.requests.server import Handler, Peer, Server
from supervisor.wire import protocol
from supervisor.wire.protocol import ProtocolError, Request

log = structlog.get_logger("gpusvd.space")

PROBE_BYTES = 256 * 1024  # room for the WAL's first frames and the shm index
RETRY_S = 2.0
FULL = (errno.ENOSPC, errno.EDQUOT)


def room_to_start(state: Path) -> OSError | None:
    """Write and sync a probe of PROBE_BYTES in the state dir: None when it fits, else
    the error (ENOSPC, EDQUOT)."""
    probe = state / ".space-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            left = memoryview(b"\0" * PROBE_BYTES)
            while left:  # a nearly full filesystem takes part of a write without error
                left = left[os.write(fd, left) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        return exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


async def wait_for_space(
    state: Path, notifier: Notifier, server: Callable[[Handler], Server] | None = None
) -> None:
    """Return once the state filesystem has room to open the database. With `server`
    (a server for a handler), the socket answers `storage` while it waits."""
    if server is None or room_to_start(state) is None:
        await _wait(state, notifier)
        return
    refusing = server(_refuse_for(state))
    async with anyio.create_task_group() as tg:
        await tg.start(refusing.run)
        await _wait(state, notifier)
        tg.cancel_scope.cancel()  # the socket is let go; the daemon binds it anew


def _refuse_for(state: Path) -> Handler:
    async def refuse(_request: Request, _peer: Peer) -> dict[str, Any]:
        free_kib = shutil.disk_usage(state).free // 1024
        raise ProtocolError(
            protocol.STORAGE,
            f"the state filesystem is full ({free_kib} KiB free in {state}): gpusvd is "
            "waiting for space before it opens its database; nothing was done",
        )

    return refuse


async def _wait(state: Path, notifier: Notifier) -> None:
    said = False
    while (exc := room_to_start(state)) is not None:
        free_kib = shutil.disk_usage(state).free // 1024
        message = (
            f"the state filesystem is full ({exc.strerror}; {free_kib} KiB free in {state}): "
            "waiting for space before opening the database"
        )
        if not said:
            log.error(message)
            said = True
        notifier.status(message)
        notifier.extend_timeout(RETRY_S * 5)
        await anyio.sleep(RETRY_S)
    if said:
        log.info("space is back: starting")
