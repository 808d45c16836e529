"""Tests for the daemon config: defaults, validation, sizes, precedence, the documented example."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon import config
from supervisor.daemon.config import (
    Config,
    ConfigError,
    DeadmanConfig,
    GpuHangConfig,
    HooksConfig,
    HostMemoryConfig,
    JobsConfig,
    LimitsConfig,
    MemSpec,
    RetriesConfig,
    WatchdogConfig,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
USER_ENV = {"HOME": "/home/ann", "XDG_RUNTIME_DIR": "/run/user/1000"}
GIB = 1024**3


def load_text(tmp_path: Path, text: str, **kwargs: Any) -> Config:
    path = tmp_path / "gpusvd.toml"
    path.write_text(text)
    kwargs.setdefault("env", USER_ENV)
    kwargs.setdefault("uid", 1000)
    return config.load(path, **kwargs)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("config: ")
    return message


# --- defaults ----------------------------------------------------------------------------


def test_defaults_without_a_file() -> None:
    cfg = config.load(None, env=USER_ENV, uid=1000)
    assert cfg.state_dir == Path("/home/ann/.local/state/gpusvd")
    assert cfg.socket == Path("/run/user/1000/gpusvd.sock")
    assert cfg.simulate_gpus is None and cfg.simulated_gpus is None
    assert cfg.kernel_log == "auto"
    assert cfg.log_format == "console"
    assert cfg.socket_mode == 0o660
    assert cfg.socket_group == "" and cfg.admin_group == ""
    assert cfg.cpu_slots == (os.cpu_count() or 1)
    assert cfg.max_queued_per_user == 100000
    assert cfg.metrics_listen == ""
    assert cfg.config_path is None
    assert cfg.host_memory == HostMemoryConfig(
        limit=None,
        reserve=MemSpec(percent=5.0),
        margin=0.05,
        sample_interval_s=0.5,
        max_backfill_wait_s=900.0,
        squeeze_below=None,
    )
    assert cfg.retries == RetriesConfig(ordinary=3, gpu_hang=20)
    assert cfg.gpu_hang == GpuHangConfig(correlation_window_s=30.0)
    assert cfg.watchdog == WatchdogConfig(progress_timeout_s=1800.0)
    assert cfg.deadman == DeadmanConfig(abort_deadline_s=60.0)
    assert cfg.jobs == JobsConfig(kill_grace_s=10.0)
    assert cfg.hooks == HooksConfig(on_finish=(), on_gpu_hang=(), timeout_s=30.0)
    assert cfg.limits == LimitsConfig(max_connections=256, idle_timeout_s=30.0)


def test_empty_file_equals_no_file(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "")
    assert cfg.config_path == tmp_path / "gpusvd.toml"
    assert cfg == replace(config.load(None, env=USER_ENV, uid=1000), config_path=cfg.config_path)


def test_config_is_frozen() -> None:
    cfg = config.load(None, env=USER_ENV, uid=1000)
    with pytest.raises(AttributeError):
        cfg.cpu_slots = 3  # type: ignore[misc]


def test_host_memory_resolution() -> None:
    hm = HostMemoryConfig()
    assert hm.limit_mb(100_000) == 100_000
    assert hm.reserve.resolve(100_000) == 5_000
    assert hm.squeeze_below_mb(100_000) == 2_500
    hm = HostMemoryConfig(limit=MemSpec(mb=64 * 1024), squeeze_below=MemSpec(mb=1000))
    assert hm.limit_mb(100_000) == 64 * 1024
    assert hm.squeeze_below_mb(100_000) == 1000


def test_memspec_needs_exactly_one_form() -> None:
    with pytest.raises(ValueError):
        MemSpec()
    with pytest.raises(ValueError):
        MemSpec(mb=1, percent=1.0)


# --- sizes and GPU specs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24G", 24 * GIB),
        ("1.5G", 3 * GIB // 2),
        ("512", 512),
        ("512M", 512 * 1024**2),
        ("2T", 2 * 1024**4),
        ("4k", 4096),
        ("1KiB", 1024),
        ("1KB", 1024),
        ("3 GiB", 3 * GIB),
        ("100B", 100),
        (" 7G ", 7 * GIB),
        ("0.5K", 512),
        ("0.001K", 2),  # rounded up to a whole byte
        ("0", 0),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert config.parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "-1", -1, "1.2.3", "G", "12X", "1 G B", "1iB", "5%", True, 1.5, None]
)
def test_parse_size_rejects(text: Any) -> None:
    with pytest.raises(ConfigError, match=r"^--mem: must be a size"):
        config.parse_size(text, "--mem")


def test_parse_size_mb_rounds_up() -> None:
    assert config.parse_size_mb("24G") == 24576
    assert config.parse_size_mb("512") == 1
    assert config.parse_size_mb("1M") == 1
    assert config.parse_size_mb(1024**2 + 1) == 2
    assert config.parse_size_mb("0") == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64G", MemSpec(mb=65536)),
        ("512M", MemSpec(mb=512)),
        ("5%", MemSpec(percent=5.0)),
        ("12.5 %", MemSpec(percent=12.5)),
        ("100%", MemSpec(percent=100.0)),
        (1024**3, MemSpec(mb=1024)),
    ],
)
def test_memspec_parse(text: str | int, expected: MemSpec) -> None:
    assert MemSpec.parse(text, "k") == expected


@pytest.mark.parametrize("text", ["101%", "-5%", "%", "x%", "5%%", "junk"])
def test_memspec_parse_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^host_memory\.reserve: "):
        MemSpec.parse(text, "host_memory.reserve")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2x24G", (2, 24576)), ("1X512M", (1, 512)), ("64x1G", (64, 1024)), (" 3 x 8G ", (3, 8192))],
)
def test_parse_gpu_spec(text: str, expected: tuple[int, int]) -> None:
    assert config.parse_gpu_spec(text) == expected


@pytest.mark.parametrize("text", ["", "2", "x24G", "0x24G", "65x1G", "2x", "2x0", "2xabc", "-1x2G"])
def test_parse_gpu_spec_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^simulate_gpus: must be NxSIZE"):
        config.parse_gpu_spec(text)


# --- validation, key by key --------------------------------------------------------------

BAD_VALUES = [
    # (TOML text, key the error must name)
    ('state_dir = ""', "state_dir"),
    ("state_dir = 3", "state_dir"),
    ("socket = false", "socket"),
    ('simulate_gpus = "2"', "simulate_gpus"),
    ('simulate_gpus = "0x24G"', "simulate_gpus"),
    ("simulate_gpus = 2", "simulate_gpus"),
    ('kernel_log = "dmesg"', "kernel_log"),
    ('kernel_log = "file:"', "kernel_log"),
    ("kernel_log = 1", "kernel_log"),
    ('log_format = "text"', "log_format"),
    ('socket_mode = "0666"', "socket_mode"),
    ('socket_mode = "0604"', "socket_mode"),
    ('socket_mode = "0661"', "socket_mode"),
    ('socket_mode = "0680"', "socket_mode"),
    ('socket_mode = "rw"', "socket_mode"),
    ('socket_mode = "1660"', "socket_mode"),
    ("socket_mode = 0o660", "socket_mode"),
    ("socket_mode = 432", "socket_mode"),
    ("socket_group = 5", "socket_group"),
    ("admin_group = []", "admin_group"),
    ("cpu_slots = -1", "cpu_slots"),
    ("cpu_slots = 2.0", "cpu_slots"),
    ('cpu_slots = "4"', "cpu_slots"),
    ("cpu_slots = true", "cpu_slots"),
    ("max_queued_per_user = 0", "max_queued_per_user"),
    ('metrics_listen = "9464"', "metrics_listen"),
    ('metrics_listen = ":9464"', "metrics_listen"),
    ('metrics_listen = "localhost:http"', "metrics_listen"),
    ('metrics_listen = "localhost:70000"', "metrics_listen"),
    ('metrics_listen = "localhost:0"', "metrics_listen"),
    ("[host_memory]\nlimit = true", "host_memory.limit"),
    ('[host_memory]\nlimit = "-5G"', "host_memory.limit"),
    ('[host_memory]\nreserve = "lots"', "host_memory.reserve"),
    ('[host_memory]\nreserve = "150%"', "host_memory.reserve"),
    ("[host_memory]\nreserve = 1.5", "host_memory.reserve"),
    ('[host_memory]\nmargin = "abc"', "host_memory.margin"),
    ("[host_memory]\nmargin = -0.1", "host_memory.margin"),
    ("[host_memory]\nmargin = nan", "host_memory.margin"),
    ("[host_memory]\nsample_interval_s = 0", "host_memory.sample_interval_s"),
    ("[host_memory]\nsample_interval_s = inf", "host_memory.sample_interval_s"),
    ("[host_memory]\nmax_backfill_wait_s = -1", "host_memory.max_backfill_wait_s"),
    ('[host_memory]\nsqueeze_below = "x"', "host_memory.squeeze_below"),
    ("[retries]\nordinary = -1", "retries.ordinary"),
    ("[retries]\nordinary = 1.5", "retries.ordinary"),
    ("[retries]\ngpu_hang = false", "retries.gpu_hang"),
    ("[gpu_hang]\ncorrelation_window_s = 0", "gpu_hang.correlation_window_s"),
    ("[watchdog]\nprogress_timeout_s = -3", "watchdog.progress_timeout_s"),
    ('[deadman]\nabort_deadline_s = "60"', "deadman.abort_deadline_s"),
    ("[deadman]\nabort_deadline_s = 0", "deadman.abort_deadline_s"),
    ("[jobs]\nkill_grace_s = -1", "jobs.kill_grace_s"),
    ("[jobs]\nstart_ahead_depth = 0", "jobs.start_ahead_depth"),
    ("[jobs]\nstart_ahead_depth = 1.5", "jobs.start_ahead_depth"),
    ("[hooks]\non_finish = 'notify \"unclosed'", "hooks.on_finish"),
    ("[hooks]\non_gpu_hang = [1, 2]", "hooks.on_gpu_hang"),
    ("[hooks]\ntimeout_s = 0", "hooks.timeout_s"),
    ("[limits]\nmax_connections = 0", "limits.max_connections"),
    ("[limits]\nidle_timeout_s = -1", "limits.idle_timeout_s"),
    ("host_memory = 5", "host_memory"),
    ('retries = "3"', "retries"),
]


@pytest.mark.parametrize(("text", "key"), BAD_VALUES)
def test_bad_value_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    assert error_of(tmp_path, text).startswith(f"config: {key}: ")


def test_error_message_shape(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[host_memory]\nmargin = "abc"')
    assert message == "config: host_memory.margin: must be a number >= 0, got 'abc'"


def test_long_bad_value_is_shortened(tmp_path: Path) -> None:
    message = error_of(tmp_path, f'log_format = "{"x" * 500}"')
    assert len(message) < 200


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("foo = 1", "foo"),
        ("[host_memory]\nfoo = 1", "host_memory.foo"),
        ("[limits]\nmax_conections = 5", "limits.max_conections"),
        ("[nosuch]\nx = 1", "nosuch"),
        ("config_path = '/x'", "config_path"),
        ("[host_memory.limit]\nx = 1", "host_memory.limit"),
    ],
)
def test_unknown_keys(tmp_path: Path, text: str, key: str) -> None:
    message = error_of(tmp_path, text)
    if key == "host_memory.limit":  # a table where a size belongs: a type error
        assert message.startswith("config: host_memory.limit: ")
    else:
        assert message == f"config: unknown key {key!r}"


@pytest.mark.parametrize(
    ("text", "attr", "expected"),
    [
        ('socket_mode = "0600"', "socket_mode", 0o600),
        ('socket_mode = "660"', "socket_mode", 0o660),
        ('socket_mode = "0o640"', "socket_mode", 0o640),
        ('socket_mode = "0770"', "socket_mode", 0o770),
        ('kernel_log = "off"', "kernel_log", "off"),
        ('kernel_log = "journal"', "kernel_log", "journal"),
        ('kernel_log = "kmsg"', "kernel_log", "kmsg"),
        ('kernel_log = "file:/tmp/k.log"', "kernel_log", "file:/tmp/k.log"),
        ('metrics_listen = "[::1]:9464"', "metrics_listen", "[::1]:9464"),
        ('metrics_listen = "0.0.0.0:1"', "metrics_listen", "0.0.0.0:1"),
        ("cpu_slots = 0", "cpu_slots", 0),
    ],
)
def test_good_top_level_values(tmp_path: Path, text: str, attr: str, expected: object) -> None:
    assert getattr(load_text(tmp_path, text), attr) == expected


def test_numbers_accept_ints_for_floats(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "[jobs]\nkill_grace_s = 0\n[deadman]\nabort_deadline_s = 5")
    assert cfg.jobs.kill_grace_s == 0.0 and isinstance(cfg.jobs.kill_grace_s, float)
    assert cfg.deadman.abort_deadline_s == 5.0


def test_hooks_are_split_into_words(tmp_path: Path) -> None:
    cfg = load_text(
        tmp_path,
        "[hooks]\non_finish = \"notify --to 'ops team' -v\"\non_gpu_hang = ['a b', 'c']",
    )
    assert cfg.hooks.on_finish == ("notify", "--to", "ops team", "-v")
    assert cfg.hooks.on_gpu_hang == ("a b", "c")
    assert load_text(tmp_path, '[hooks]\non_finish = ""').hooks.on_finish == ()


# --- files -------------------------------------------------------------------------------


def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=rf"^config: cannot read {re.escape(str(missing))}: "):
        config.load(missing, env=USER_ENV, uid=1000)


def test_directory_as_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config: cannot read "):
        config.load(tmp_path, env=USER_ENV, uid=1000)


@pytest.mark.parametrize("text", ["cpu_slots = ", "[retries\n", "a = 1\na = 2", "x = 'unclosed"])
def test_invalid_toml_names_the_file(tmp_path: Path, text: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(f"config: {tmp_path / 'gpusvd.toml'}: invalid TOML: ")


def test_binary_file_is_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "gpusvd.toml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="invalid TOML"):
        config.load(path, env=USER_ENV, uid=1000)


def documented_example() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "docs/configuration.md must hold exactly one toml example"
    return str(blocks[0])


def test_documented_example_loads(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, documented_example())
    default = config.load(None, env=USER_ENV, uid=1000)
    # The example sets every key; all but these differ from the defaults, so a key that
    # the loader skipped would show.
    same_as_default = {"config_path", "socket_mode", "cpu_slots"}
    for f in fields(Config):
        if f.name not in same_as_default:
            assert getattr(cfg, f.name) != getattr(default, f.name), f.name
    sections = [
        f.name for f in fields(Config) if hasattr(getattr(cfg, f.name), "__dataclass_fields__")
    ]
    assert len(sections) == 10
    for section in sections:
        for f in fields(getattr(cfg, section)):
            chosen = getattr(getattr(cfg, section), f.name)
            assert chosen != getattr(getattr(default, section), f.name), f"{section}.{f.name}"
    assert cfg.simulated_gpus == (2, 24576)
    assert cfg.host_memory.limit == MemSpec(mb=120 * 1024)
    assert cfg.host_memory.squeeze_below == MemSpec(percent=3.0)
    assert cfg.hooks.on_gpu_hang == ("/usr/local/bin/gpusv-notify", "--event", "gpu hang")


def test_every_key_is_documented() -> None:
    text = DOC.read_text()
    cfg = config.load(None, env=USER_ENV, uid=1000)
    for f in fields(Config):
        if f.name == "config_path":
            continue
        value = getattr(cfg, f.name)
        if hasattr(value, "__dataclass_fields__"):
            assert f"### `[{f.name}]`" in text, f.name
            for sub in fields(value):
                assert f"`{sub.name}`" in text, f"{f.name}.{sub.name}"
        else:
            assert f"`{f.name}`" in text, f.name


# --- precedence: flags, environment, file --------------------------------------------------


def test_flags_override_the_file(tmp_path: Path) -> None:
    text = 'state_dir = "/from/file"\nkernel_log = "off"\nlog_format = "json"\n'
    text += 'simulate_gpus = "1x8G"\n'
    flags = {
        "state_dir": "/from/flag",
        "kernel_log": "kmsg",
        "log_format": "console",
        "simulate_gpus": "4x16G",
        "socket": None,
    }
    cfg = load_text(tmp_path, text, flags=flags)
    assert cfg.state_dir == Path("/from/flag")
    assert cfg.kernel_log == "kmsg"
    assert cfg.log_format == "console"
    assert cfg.simulated_gpus == (4, 16384)
    kept = load_text(tmp_path, text, flags={"state_dir": None, "kernel_log": None})
    assert kept.state_dir == Path("/from/file") and kept.kernel_log == "off"


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        ({"kernel_log": "dmesg"}, "--kernel-log"),
        ({"log_format": "xml"}, "--log-format"),
        ({"simulate_gpus": "lots"}, "--simulate-gpus"),
        ({"state_dir": ""}, "--state-dir"),
        ({"socket": ""}, "--socket"),
    ],
)
def test_bad_flag_names_the_flag(flags: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config: {flag}: "):
        config.load(None, flags=flags, env=USER_ENV, uid=1000)


def test_unknown_flag_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown flag 'cpu_slots'"):
        config.load(None, flags={"cpu_slots": 3}, env=USER_ENV, uid=1000)


def test_relative_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = config.load(None, flags={"state_dir": "state", "socket": "s.sock"}, env={}, uid=1000)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.socket == tmp_path / "s.sock"
    home = config.load(None, flags={"state_dir": "~/st"}, env=USER_ENV, uid=1000)
    assert home.state_dir == Path.home() / "st"


def test_env_overrides_the_deadline(tmp_path: Path) -> None:
    env = {**USER_ENV, "GPUSVD_ABORT_DEADLINE_S": "2.5"}
    cfg = load_text(tmp_path, "[deadman]\nabort_deadline_s = 90", env=env)
    assert cfg.deadman.abort_deadline_s == 2.5
    blank = load_text(
        tmp_path, "[deadman]\nabort_deadline_s = 90", env={"GPUSVD_ABORT_DEADLINE_S": ""}
    )
    assert blank.deadman.abort_deadline_s == 90.0


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_bad_env_deadline_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^config: GPUSVD_ABORT_DEADLINE_S: must be a number"):
        config.load(None, env={"GPUSVD_ABORT_DEADLINE_S": value}, uid=1000)


def test_socket_precedence_through_load(tmp_path: Path) -> None:
    text = 'socket = "/file.sock"'
    env = {**USER_ENV, "GPUSV_SOCKET": "/env.sock"}
    assert load_text(tmp_path, text, env=env, flags={"socket": "/flag.sock"}).socket == Path(
        "/flag.sock"
    )
    assert load_text(tmp_path, text, env=env).socket == Path("/env.sock")
    assert load_text(tmp_path, text).socket == Path("/file.sock")
    assert load_text(tmp_path, "", uid=0).socket == Path("/run/gpusvd/gpusvd.sock")
    assert load_text(tmp_path, "").socket == Path("/run/user/1000/gpusvd.sock")


# --- default locations -------------------------------------------------------------------


def test_resolve_socket_order() -> None:
    env = {"GPUSV_SOCKET": "/env.sock", "XDG_RUNTIME_DIR": "/run/user/1000"}
    assert config.resolve_socket("/flag.sock", env, "/file.sock", 1000) == Path("/flag.sock")
    assert config.resolve_socket(None, env, "/file.sock", 1000) == Path("/env.sock")
    no_env = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert config.resolve_socket(None, no_env, "/file.sock", 1000) == Path("/file.sock")
    assert config.resolve_socket(None, no_env, None, 0) == Path("/run/gpusvd/gpusvd.sock")
    assert config.resolve_socket(None, no_env, None, 1000) == Path("/run/user/1000/gpusvd.sock")
    assert config.resolve_socket(None, {}, None, 1000) == Path("/tmp/gpusvd-1000/gpusvd.sock")
    # Empty counts as unset at every step.
    assert config.resolve_socket("", {"GPUSV_SOCKET": ""}, "", 1000) == Path(
        "/tmp/gpusvd-1000/gpusvd.sock"
    )
    relative_runtime = {"XDG_RUNTIME_DIR": "run"}
    assert config.resolve_socket(None, relative_runtime, None, 7) == Path(
        "/tmp/gpusvd-7/gpusvd.sock"
    )


def test_default_state_dir() -> None:
    assert config.default_state_dir(0, USER_ENV) == Path("/var/lib/gpusvd")
    xdg = {"HOME": "/home/ann", "XDG_STATE_HOME": "/data/state"}
    assert config.default_state_dir(1000, xdg) == Path("/data/state/gpusvd")
    assert config.default_state_dir(1000, {"HOME": "/home/ann"}) == Path(
        "/home/ann/.local/state/gpusvd"
    )
    relative = {"HOME": "/home/ann", "XDG_STATE_HOME": "state"}
    assert config.default_state_dir(1000, relative) == Path("/home/ann/.local/state/gpusvd")


def test_import_is_cheap() -> None:
    """The CLI imports config: it must pull in no third-party package, nor tomllib."""
    code = (
        "import sys, supervisor.daemon.config; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert "supervisor" in loaded
    assert not loaded & {"tomllib", "structlog", "anyio", "psutil", "pynvml", "aiosqlite"}


def test_a_card_probe_that_could_outlast_the_abort_deadline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config: gpus.probe_deadline_s \(10\) must be at most"):
        load_text(tmp_path, "[gpus]\nprobe_deadline_s = 10\n[deadman]\nabort_deadline_s = 10")
    three_of_five = r"probe_deadline_s \(3\) .* deadman.abort_deadline_s \(5\)"
    with pytest.raises(ConfigError, match=three_of_five):
        load_text(tmp_path, "[gpus]\nprobe_deadline_s = 3\n[deadman]\nabort_deadline_s = 5")
    fits = load_text(tmp_path, "[gpus]\nprobe_deadline_s = 5\n[deadman]\nabort_deadline_s = 10")
    assert fits.gpus.probe_deadline_s == 5.0


def test_an_unset_card_probe_shrinks_to_fit_a_short_abort_deadline(tmp_path: Path) -> None:
    short = load_text(tmp_path, "[deadman]\nabort_deadline_s = 6", env=USER_ENV)
    assert short.gpus.probe_deadline_s == 3.0
    env = {**USER_ENV, "GPUSVD_ABORT_DEADLINE_S": "2.5"}
    assert load_text(tmp_path, "", env=env).gpus.probe_deadline_s == 1.25
    assert load_text(tmp_path, "", env=USER_ENV).gpus.probe_deadline_s == 10.0
    with pytest.raises(ConfigError, match="probe_deadline_s"):
        load_text(tmp_path, "[gpus]\nprobe_deadline_s = 2", env=env)
