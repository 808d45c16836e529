"""Start-up chores of gpusvd that need none of its parts: the command line, the state
dir's lock, the deadman's exit marker (left by one run, recorded by the next), and the
child watcher."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import structlog

from supervisor.daemon.clock import iso_from_epoch
from supervisor.daemon.requests.server import StartupError
from supervisor.daemon.store.database import Store

log = structlog.get_logger("gpusvd")
EXIT_MARKER = "last-exit.json"


def deadman_exit(state_dir: Path) -> Any:
    """Leave a marker for the next start (metrics and health report deadman fires), then
    leave without destructors: a drain cannot work when an abort is stuck."""

    def exit_(code: int) -> NoReturn:
        with contextlib.suppress(OSError):
            marker = state_dir / EXIT_MARKER
            marker.write_text(json.dumps({"kind": "deadman", "at": time.time(), "code": code}))
        os._exit(code)

    return exit_


async def record_previous_exit(store: Store, state_dir: Path) -> None:
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


def lock_state_dir(state: Path) -> int:
    """One daemon per state dir: a second one would reconcile, and so kill, the first
    one's running jobs. The lock is held until the process exits."""
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another gpusvd is already using the state dir {state}") from None
    return fd


def pidfd_child_watcher() -> None:
    """Python 3.11's default child watcher starts a thread per child process (hooks, the
    journal reader); a pidfd watcher needs none. 3.12 does this by default."""
    if sys.version_info >= (3, 12):
        return
    import asyncio

    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser() -> argparse.ArgumentParser:
    """gpusvd's command line (its man page is generated from it: scripts/manpages.py)."""
    p = argparse.ArgumentParser(
        prog="gpusvd",
        description="gpusv job supervisor daemon",
        epilog="Exit codes: 0 clean stop, 2 bad usage or config (one line says why), "
        "70 the deadman (an abort outlived its deadline).",
    )
    p.add_argument("--version", action=_Version, help="show the version and exit")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML config file (default: $GPUSVD_CONFIG, else /etc/gpusvd.toml if it exists)",
    )
    p.add_argument(
        "--state-dir", dest="state_dir", metavar="DIR", help="database and job logs directory"
    )
    p.add_argument("--socket", metavar="PATH", help="Unix socket path to serve")
    p.add_argument(
        "--simulate-gpus", dest="simulate_gpus", metavar="NxSIZE", help="fake cards, e.g. 2x24G"
    )
    p.add_argument(
        "--kernel-log",
        dest="kernel_log",
        metavar="SOURCE",
        help="auto, journal, kmsg, file:PATH or off",
    )
    p.add_argument("--log-format", dest="log_format", metavar="FORMAT", help="console or json")
    p.add_argument(
        "--log-level",
        dest="log_level",
        default="info",
        metavar="LEVEL",
        help="debug, info, warning or error",
    )
    return p


class _Version(argparse.Action):
    """--version, looked up only when asked for: importlib.metadata brings email, zipfile
    and csv with it, megabytes that a running daemon would otherwise keep."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(f"gpusvd {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpusv")
    except PackageNotFoundError:
        return "unknown"
