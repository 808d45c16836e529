"""SIGHUP: read the config again and apply what can change while jobs run.

What is applied: the hooks, the connection limits, `admin_group`, `max_queued_per_user`,
`log_job_lines_per_s` and the defaults that new submits take (`[retries]`,
`[watchdog]`). Everything else (the state dir, the socket, the GPUs, memory limits, ...)
is kept as it was started and named in the log as needing a restart. A config that does
not load changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import structlog

from supervisor.daemon.config import Config, ConfigError
from supervisor.daemon.requests.server import connection_cap

if TYPE_CHECKING:
    from collections.abc import Callable

    from supervisor.daemon.engine import Engine
    from supervisor.daemon.requests.access import Access
    from supervisor.daemon.requests.handlers import Api
    from supervisor.daemon.requests.server import Server
    from supervisor.daemon.watch.hooks import Hooks


class Parts(Protocol):
    """What a reload changes (the daemon's parts)."""

    cfg: Config
    api: Api
    engine: Engine
    hooks: Hooks
    access: Access
    server: Server
    load_config: Callable[[], Config] | None


log = structlog.get_logger("gpusvd")

RELOADABLE = frozenset(
    {
        "hooks",
        "limits",
        "admin_group",
        "max_queued_per_user",
        "retries",
        "watchdog",
        "log_job_lines_per_s",
    }
)


def plan(running: Config, loaded: Config) -> tuple[Config, list[str], list[str]]:
    """The config to run with now, the keys it changes, and the changed keys that only a
    restart can apply (those keep their running values)."""
    applied, restart = [], []
    changes = {}
    for f in dataclasses.fields(Config):
        old, new = getattr(running, f.name), getattr(loaded, f.name)
        if old == new:
            continue
        if f.name in RELOADABLE:
            applied.append(f.name)
            changes[f.name] = new
        else:
            restart.append(f.name)
    return dataclasses.replace(running, **changes), applied, restart


def apply(parts: Parts) -> None:
    """Apply what of the config can change while jobs run; a bad config changes nothing."""
    if parts.load_config is None:
        log.info("SIGHUP: nothing to reload (started without a config loader)")
        return
    try:
        loaded = parts.load_config()
    except (ConfigError, ValueError, OSError) as exc:
        log.error("SIGHUP: config not reloaded; running on as before", error=str(exc))
        return
    cfg, applied, restart = plan(parts.cfg, loaded)
    parts.cfg = cfg
    parts.api.reconfigure(cfg)
    parts.hooks.reconfigure(cfg.hooks)
    parts.engine.lines.reconfigure(cfg.log_job_lines_per_s)
    parts.access.reconfigure(cfg.admin_group)
    limits = cfg.limits
    cap = connection_cap(limits.max_connections)
    parts.server.set_limits(cap, limits.max_connections_per_user, limits.idle_timeout_s)
    log.info("SIGHUP: config reloaded", applied=applied or None, needs_restart=restart or None)
