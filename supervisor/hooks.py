"""Operator hooks: `on_finish` and `on_gpu_hang` commands run with the job's JSON on stdin.

For notifications (chat, e-mail) without polling. A hook runs as the daemon's user, in
its own session, and is killed when it outlives `hooks.timeout_s`; a failing hook is
logged and never affects the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

import anyio
import structlog

log = structlog.get_logger("gpusvd.hooks")


async def run_hook(
    name: str, argv: Sequence[str], payload: dict[str, Any], timeout_s: float
) -> int | None:
    """The hook's exit code, or None when it could not start or timed out."""
    if not argv:
        return None
    data = json.dumps(payload).encode() + b"\n"
    env = {**os.environ, "GPUSV_HOOK": name, "GPUSV_JOB_ID": str(payload.get("id", ""))}
    try:
        proc = await anyio.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        log.warning("hook could not start", hook=name, argv=list(argv), error=str(exc))
        return None
    async with proc:
        with anyio.move_on_after(timeout_s) as scope:
            assert proc.stdin is not None
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await proc.stdin.send(data)
            await proc.stdin.aclose()
            code = await proc.wait()
        if scope.cancelled_caught:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            log.warning("hook timed out and was killed", hook=name, timeout_s=timeout_s)
            return None
    if code != 0:
        log.warning("hook failed", hook=name, exit_code=code)
    return code
