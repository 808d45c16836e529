"""Configuration: a TOML file, command-line flags and two environment variables, validated
once at start into a tree of frozen dataclasses.

Standard library only. Sizes (sizes.py) and default paths (locations.py) live apart, so
that the CLI can use them without loading this.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from supervisor.daemon.config_values import _bool, _int, _number, _path, _string
from supervisor.wire.durations import parse_duration
from supervisor.wire.locations import (
    SOCKET_ENV as SOCKET_ENV,  # re-exported: part of the config's API
)
from supervisor.wire.locations import default_state_dir as default_state_dir
from supervisor.wire.locations import resolve_socket as resolve_socket
from supervisor.wire.sizes import ConfigError as ConfigError
from supervisor.wire.sizes import _fail
from supervisor.wire.sizes import parse_size as parse_size
from supervisor.wire.sizes import parse_size_mb as parse_size_mb

_GPU_SPEC_RE = re.compile(r"(\d+)\s*[xX]\s*(\S+)")
_MAX_SIMULATED_GPUS = 64
_SECTION = {"section": True}
_KERNEL_LOG_SOURCES = ("auto", "journal", "kmsg", "off")
_FLAG_KEYS = ("state_dir", "socket", "simulate_gpus", "kernel_log", "log_format")
DEADLINE_ENV = "GPUSVD_ABORT_DEADLINE_S"


def parse_gpu_spec(text: str, key: str = "simulate_gpus") -> tuple[int, int]:
    """(count, VRAM MiB) from "NxSIZE", e.g. "2x24G" -> (2, 24576)."""
    problem = f"must be NxSIZE like '2x24G' with 1 <= N <= {_MAX_SIMULATED_GPUS}"
    match = _GPU_SPEC_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise _fail(key, problem, text)
    count = int(match.group(1))
    if not 1 <= count <= _MAX_SIMULATED_GPUS:
        raise _fail(key, problem, text)
    try:
        vram_mb = parse_size_mb(match.group(2), key)
    except ConfigError:
        raise _fail(key, problem, text) from None
    if vram_mb <= 0:
        raise _fail(key, problem + " and SIZE > 0", text)
    return count, vram_mb


@dataclass(frozen=True)
class MemSpec:
    """An amount of host memory: a fixed size in MiB, or a percent of MemTotal."""

    mb: int | None = None
    percent: float | None = None

    def __post_init__(self) -> None:
        if (self.mb is None) == (self.percent is None):
            raise ValueError("MemSpec needs exactly one of mb and percent")

    def resolve(self, total_mb: int) -> int:
        if self.mb is not None:
            return self.mb
        assert self.percent is not None
        return int(total_mb * self.percent / 100)

    @classmethod
    def parse(cls, text: str | int, key: str) -> MemSpec:
        """ "64G", "512M", "5%", or a plain integer number of bytes."""
        if isinstance(text, str) and text.strip().endswith("%"):
            match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*%", text.strip())
            if match is None or float(match.group(1)) > 100:
                raise _fail(key, "must be a percent between 0 and 100 like '5%'", text)
            return cls(percent=float(match.group(1)))
        return cls(mb=parse_size_mb(text, key))


def _mem(value: object, key: str) -> MemSpec:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _fail(key, "must be a size like '64G' or a percent like '5%'", value)
    return MemSpec.parse(value, key)


def _gpu_spec(value: object, key: str) -> str:
    parse_gpu_spec(_string(value, key), key)
    return str(value).strip()


def _kernel_log(value: object, key: str) -> str:
    text = _string(value, key)
    if text in _KERNEL_LOG_SOURCES or (text.startswith("file:") and text[5:].strip()):
        return text
    raise _fail(key, "must be auto, journal, kmsg, off or file:PATH", value)


def _log_format(value: object, key: str) -> str:
    if value not in ("console", "json"):
        raise _fail(key, "must be console or json", value)
    return str(value)


def _socket_mode(value: object, key: str) -> int:
    problem = "must be an octal string like '0660' with no bits for others"
    text = value.strip() if isinstance(value, str) else ""
    if not re.fullmatch(r"(?:0o?)?[0-7]{1,4}", text):
        raise _fail(key, problem, value)
    mode = int(text.removeprefix("0o") or "0", 8)
    # Any "other" bit lets every local user reach the daemon (or see its socket):
    # refused outright, access is granted with socket_group instead.
    if mode > 0o777 or mode & 0o007:
        raise _fail(key, problem, value)
    return mode


def _listen(value: object, key: str) -> str:
    text = _string(value, key).strip()
    if not text:
        return ""
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _fail(key, "must be HOST:PORT like '127.0.0.1:9464', or empty", value)
    return text


def _command(value: object, key: str) -> tuple[str, ...]:
    """A command line split into words; a TOML array of strings is taken as given."""
    if isinstance(value, list) and all(isinstance(word, str) for word in value):
        return tuple(value)
    try:
        return tuple(shlex.split(_string(value, key)))
    except ValueError as exc:
        raise _fail(key, f"is not a valid command line ({exc})", value) from None


_TIMEOUT = _number(0.0, above=True)


@dataclass(frozen=True)
class HostMemoryConfig:
    """`limit` None means MemTotal; `squeeze_below` None means half the reserve."""

    limit: MemSpec | None = field(default=None, metadata={"parse": _mem})
    reserve: MemSpec = field(default=MemSpec(percent=5.0), metadata={"parse": _mem})
    margin: float = field(default=0.05, metadata={"parse": _number(0.0)})
    sample_interval_s: float = field(default=0.5, metadata={"parse": _TIMEOUT})
    max_backfill_wait_s: float = field(default=900.0, metadata={"parse": _number(0.0)})
    squeeze_below: MemSpec | None = field(default=None, metadata={"parse": _mem})
    # A job's --mem as its cgroup's hard limit (memory.max, or memory.limit_in_bytes on
    # v1): off by default, since --mem is otherwise a figure for admission only.
    enforce_declared: bool = field(default=False, metadata={"parse": _bool})

    def limit_mb(self, total_mb: int) -> int:
        return total_mb if self.limit is None else self.limit.resolve(total_mb)

    def squeeze_below_mb(self, total_mb: int) -> int:
        if self.squeeze_below is None:
            return self.reserve.resolve(total_mb) // 2
        return self.squeeze_below.resolve(total_mb)


@dataclass(frozen=True)
class RetriesConfig:
    ordinary: int = field(default=3, metadata={"parse": _int(0)})
    gpu_hang: int = field(default=20, metadata={"parse": _int(0)})


@dataclass(frozen=True)
class GpuHangConfig:
    correlation_window_s: float = field(default=30.0, metadata={"parse": _TIMEOUT})


@dataclass(frozen=True)
class WatchdogConfig:
    progress_timeout_s: float = field(default=1800.0, metadata={"parse": _TIMEOUT})
    # 0: off. No output for this long fails a job as gpu_hang at any utilization.
    stall_timeout_s: float = field(default=0.0, metadata={"parse": _number(0.0)})


def _visible_by(value: object, key: str) -> str:
    if value not in ("index", "uuid"):
        raise _fail(key, "must be index or uuid", value)
    return str(value)


@dataclass(frozen=True)
class GpusConfig:
    visible_devices: Literal["index", "uuid"] = field(
        default="index", metadata={"parse": _visible_by}
    )
    probe_deadline_s: float = field(default=10.0, metadata={"parse": _TIMEOUT})


@dataclass(frozen=True)
class DeadmanConfig:
    abort_deadline_s: float = field(default=60.0, metadata={"parse": _TIMEOUT})


@dataclass(frozen=True)
class JobsConfig:
    kill_grace_s: float = field(default=10.0, metadata={"parse": _number(0.0)})
    # A keeper that leaves a ping unanswered this long is "not answering": its card
    # takes no new job and its jobs' stops go to their cgroups (docs/keepers.md).
    keeper_silent_s: float = field(default=5.0, metadata={"parse": _TIMEOUT})
    # Behind a job whose kind last succeeded in under this many seconds, the next job of
    # its card or CPU slot is claimed while it runs, and its keeper starts that one the
    # moment it exits (docs/architecture.md, "Starting ahead"). 0: never.
    start_ahead_s: float = field(default=2.0, metadata={"parse": _number(0.0)})
    # How many jobs may wait so, one behind the other, on one card or CPU slot (and only
    # as many as their kinds' last runs fit in start_ahead_s: this bounds lines of jobs
    # of a few milliseconds, whose keeper must not run out of them between two passes).
    start_ahead_depth: int = field(default=32, metadata={"parse": _int(1)})


def _duration(value: object, key: str) -> float:
    return parse_duration(value if isinstance(value, str | int | float) else str(value), key)


def _bytes(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _fail(key, "must be a size like '1G'", value)
    size = parse_size(value, key)
    if size < 1 << 20:
        raise _fail(key, "must be at least 1M", value)
    return size


@dataclass(frozen=True)
class LogsConfig:
    """Job output files: their size, their life, and Python's buffering."""

    max_size: int = field(default=1 << 30, metadata={"parse": _bytes})  # per stream, per job
    retention: float = field(default=30 * 86400.0, metadata={"parse": _duration})
    python_unbuffered: bool = field(default=True, metadata={"parse": _bool})


@dataclass(frozen=True)
class HooksConfig:
    on_finish: tuple[str, ...] = field(default=(), metadata={"parse": _command})
    on_gpu_hang: tuple[str, ...] = field(default=(), metadata={"parse": _command})
    timeout_s: float = field(default=30.0, metadata={"parse": _TIMEOUT})


@dataclass(frozen=True)
class LimitsConfig:
    max_connections: int = field(default=256, metadata={"parse": _int(1)})
    max_connections_per_user: int = field(default=64, metadata={"parse": _int(1)})
    idle_timeout_s: float = field(default=30.0, metadata={"parse": _TIMEOUT})


@dataclass(frozen=True)
class Config:
    state_dir: Path = field(metadata={"parse": _path})
    socket: Path = field(metadata={"parse": _path})
    simulate_gpus: str | None = field(default=None, metadata={"parse": _gpu_spec})
    kernel_log: str = field(default="auto", metadata={"parse": _kernel_log})
    log_format: Literal["console", "json"] = field(
        default="console", metadata={"parse": _log_format}
    )
    log_job_lines_per_s: int = field(default=20, metadata={"parse": _int(0)})  # 0: no cap
    socket_mode: int = field(default=0o660, metadata={"parse": _socket_mode})
    socket_group: str = field(default="", metadata={"parse": _string})
    admin_group: str = field(default="", metadata={"parse": _string})
    cpu_slots: int = field(default_factory=lambda: os.cpu_count() or 1, metadata={"parse": _int(0)})
    max_queued_per_user: int = field(default=100000, metadata={"parse": _int(1)})
    metrics_listen: str = field(default="", metadata={"parse": _listen})
    host_memory: HostMemoryConfig = field(default_factory=HostMemoryConfig, metadata=_SECTION)
    retries: RetriesConfig = field(default_factory=RetriesConfig, metadata=_SECTION)
    gpu_hang: GpuHangConfig = field(default_factory=GpuHangConfig, metadata=_SECTION)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig, metadata=_SECTION)
    gpus: GpusConfig = field(default_factory=GpusConfig, metadata=_SECTION)
    deadman: DeadmanConfig = field(default_factory=DeadmanConfig, metadata=_SECTION)
    jobs: JobsConfig = field(default_factory=JobsConfig, metadata=_SECTION)
    hooks: HooksConfig = field(default_factory=HooksConfig, metadata=_SECTION)
    limits: LimitsConfig = field(default_factory=LimitsConfig, metadata=_SECTION)
    logs: LogsConfig = field(default_factory=LogsConfig, metadata=_SECTION)
    config_path: Path | None = None

    @property
    def simulated_gpus(self) -> tuple[int, int] | None:
        """(count, VRAM MiB) of the simulated cards, or None for real GPUs."""
        return None if self.simulate_gpus is None else parse_gpu_spec(self.simulate_gpus)


def _parse_table(cls: type, table: Mapping[str, object], prefix: str = "") -> dict[str, Any]:
    """Parsed values for the keys present in `table`; absent keys keep their defaults."""
    known = {f.name: f for f in fields(cls) if f.metadata}
    values: dict[str, Any] = {}
    for name, raw in table.items():
        key = prefix + name
        if name not in known:
            raise ConfigError(f"unknown key {key!r}")
        spec = known[name]
        if "section" in spec.metadata:
            if not isinstance(raw, dict):
                raise _fail(key, f"must be a table [{key}]", raw)
            section: Any = spec.default_factory
            values[name] = section(**_parse_table(section, raw, key + "."))
        else:
            values[name] = spec.metadata["parse"](raw, key)
    return values


_FIELDS = {f.name: f for f in fields(Config)}


def _read_toml(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _deadline_from_env(env: Mapping[str, str], deadman: DeadmanConfig) -> DeadmanConfig:
    text = env.get(DEADLINE_ENV, "").strip()
    if not text:
        return deadman
    try:
        value: object = float(text)
    except ValueError:
        value = text
    return replace(deadman, abort_deadline_s=_TIMEOUT(value, DEADLINE_ENV))


def _fit_probe(gpus: GpusConfig, deadman: DeadmanConfig, explicit: bool) -> GpusConfig:
    """A card that does not answer at start must end up `lost`, not in the deadman's exit
    70: the whole discovery (driver start-up, then every card's probe at once) runs under
    the abort deadline, so the probe may take at most half of it. Left unset, the probe's
    deadline shrinks to fit a short abort deadline; set too long, the config is refused."""
    probe, abort = gpus.probe_deadline_s, deadman.abort_deadline_s
    if probe <= abort / 2:
        return gpus
    if not explicit:
        return replace(gpus, probe_deadline_s=abort / 2)
    raise ConfigError(
        f"gpus.probe_deadline_s ({probe:g}) must be at most half of "
        f"deadman.abort_deadline_s ({abort:g}): a card that does not answer at start "
        "would end every start in the deadman's exit 70 instead of being marked lost"
    )


def _parse_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, raw in flags.items():
        if name not in _FLAG_KEYS:
            raise ConfigError(f"unknown flag {name!r}")
        if raw is not None:
            values[name] = _FIELDS[name].metadata["parse"](raw, "--" + name.replace("_", "-"))
    return values


def load(
    path: Path | None,
    *,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    uid: int | None = None,
) -> Config:
    """Defaults, then the TOML file, then the environment, then flags (flags win).

    Raises ConfigError with a one-line message starting "config: " and naming the key.
    """
    env = os.environ if env is None else env
    uid = os.getuid() if uid is None else uid
    try:
        raw = _read_toml(path) if path is not None else {}
        values = _parse_table(Config, raw)
        given = _parse_flags(flags or {})
        values["deadman"] = _deadline_from_env(env, values.get("deadman", DeadmanConfig()))
        gpus_table = raw.get("gpus")
        explicit = isinstance(gpus_table, dict) and "probe_deadline_s" in gpus_table
        values["gpus"] = _fit_probe(values.get("gpus", GpusConfig()), values["deadman"], explicit)
    except ConfigError as exc:
        raise ConfigError(f"config: {exc}") from None
    file_socket, flag_socket = values.pop("socket", None), given.pop("socket", None)
    values.update(given)
    values.setdefault("state_dir", default_state_dir(uid, env))
    flag, from_file = flag_socket and str(flag_socket), file_socket and str(file_socket)
    socket = resolve_socket(flag, env, from_file, uid)
    return Config(socket=socket, config_path=path, **values)
