"""Start-up on a full state filesystem: wait for space instead of failing.

SQLite cannot open a database in WAL mode without room for its -wal and -shm files, and
reports that as a "disk I/O error", which reads like a damaged database. A full disk is
not a damaged database: the daemon says which it is, waits (telling systemd, so that
neither the start timeout nor the start limit gives up on it), and starts by itself
once space is back."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

import anyio
import structlog

from supervisor.daemon.life.systemd import Notifier

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


async def wait_for_space(state: Path, notifier: Notifier) -> None:
    """Return once the state filesystem has room to open the database."""
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
