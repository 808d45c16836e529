"""Where gpusvd keeps its state and its socket, when nothing says otherwise.

Standard library only and cheap to import: the CLI resolves the socket with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SOCKET_ENV = "GPUSV_SOCKET"
CONFIG_ENV = "GPUSVD_CONFIG"
SYSTEM_CONFIG = Path("/etc/gpusvd.toml")
SYSTEM_SOCKET = Path("/run/gpusvd/gpusvd.sock")


def default_state_dir(uid: int, env: Mapping[str, str]) -> Path:
    """/var/lib/gpusvd for root, else $XDG_STATE_HOME/gpusvd or ~/.local/state/gpusvd."""
    if uid == 0:
        return Path("/var/lib/gpusvd")
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "gpusvd"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".local" / "state" / "gpusvd"


def resolve_socket(
    flag: str | None, env: Mapping[str, str], config_socket: str | None, uid: int
) -> Path:
    """--socket, $GPUSV_SOCKET, the config's socket, then the per-user default."""
    for candidate in (flag, env.get(SOCKET_ENV), config_socket):
        if candidate:
            return Path(os.fspath(candidate)).expanduser().absolute()
    if uid == 0:
        return SYSTEM_SOCKET
    return user_socket(env, uid)


def user_socket(env: Mapping[str, str], uid: int) -> Path:
    """A non-root gpusvd's default socket: $XDG_RUNTIME_DIR/gpusvd.sock."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and Path(runtime).is_absolute():
        return Path(runtime) / "gpusvd.sock"
    return Path(f"/tmp/gpusvd-{uid}/gpusvd.sock")


def client_sockets(flag: str | None, env: Mapping[str, str], uid: int) -> list[Path]:
    """Where the CLI looks, in order: --socket or $GPUSV_SOCKET alone when given; else
    the user's own gpusvd's socket if it exists, then the system one."""
    for candidate in (flag, env.get(SOCKET_ENV)):
        if candidate:
            return [Path(os.fspath(candidate)).expanduser().absolute()]
    own = user_socket(env, uid)
    return [own, SYSTEM_SOCKET] if own.exists() or own.is_symlink() else [SYSTEM_SOCKET]


def config_path(flag: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    """--config, else $GPUSVD_CONFIG, else /etc/gpusvd.toml when it exists, else none."""
    if flag:
        return Path(os.fspath(flag))
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    return SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None


def config_socket(path: Path) -> str | None:
    """The `socket` key of a gpusvd config file, for a client given `--config`: TOML read
    with the standard library alone, so that the client never loads the daemon's config
    code. The daemon validates the rest of the file; the client needs only this key."""
    import tomllib

    from supervisor.wire.sizes import ConfigError

    try:
        with path.open("rb") as f:
            value = tomllib.load(f).get("socket")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{path}: socket: expected a path string")
    return value
