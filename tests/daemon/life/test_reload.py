"""SIGHUP's plan: which changed keys apply now and which wait for a restart, on configs
read from real TOML files; and a config that does not load changes nothing."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any, cast

from supervisor.daemon import config
from supervisor.daemon.config import Config, ConfigError
from supervisor.daemon.life import reload

ENV = {"HOME": "/home/ann", "XDG_RUNTIME_DIR": "/run/user/1000"}
BASE = 'state_dir = "/var/lib/gpusv"\nsocket = "/run/gpusv.sock"\n'


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "gpusvd.toml"
    path.write_text(BASE + text)
    return config.load(path, env=ENV, uid=0)


def test_reloadable_keys_apply_and_the_rest_wait_for_a_restart(tmp_path: Path) -> None:
    running = load(tmp_path, "")
    loaded = load(
        tmp_path,
        'admin_group = "ops"\n'
        "max_queued_per_user = 50\n"
        "log_job_lines_per_s = 5\n"
        'kernel_log = "off"\n'
        "cpu_slots = 3\n"
        "[retries]\nordinary = 1\n"
        "[watchdog]\nprogress_timeout_s = 60\n"
        "[limits]\nmax_connections = 10\n"
        '[hooks]\non_finish = "/bin/true"\n'
        "[jobs]\nkill_grace_s = 1\n",
    )
    cfg, applied, restart = reload.plan(running, loaded)
    assert applied == [
        "log_job_lines_per_s",
        "admin_group",
        "max_queued_per_user",
        "retries",
        "watchdog",
        "hooks",
        "limits",
    ]
    assert restart == ["kernel_log", "cpu_slots", "jobs"]
    assert cfg.admin_group == "ops" and cfg.max_queued_per_user == 50
    assert cfg.log_job_lines_per_s == 5 and cfg.retries.ordinary == 1
    assert cfg.watchdog.progress_timeout_s == 60.0 and cfg.limits.max_connections == 10
    assert cfg.hooks.on_finish == ("/bin/true",)
    # Restart-only keys keep the values the daemon started with.
    assert cfg.kernel_log == running.kernel_log and cfg.cpu_slots == running.cpu_slots
    assert cfg.jobs == running.jobs and cfg.jobs.kill_grace_s == 10.0


def test_the_state_dir_and_socket_never_change_on_reload(tmp_path: Path) -> None:
    running = load(tmp_path, "")
    path = tmp_path / "other.toml"
    path.write_text('state_dir = "/srv/gpusv"\nsocket = "/tmp/g.sock"\nadmin_group = "x"\n')
    cfg, applied, restart = reload.plan(running, config.load(path, env=ENV, uid=0))
    assert applied == ["admin_group"]
    assert restart == ["state_dir", "socket", "config_path"]
    assert cfg.state_dir == Path("/var/lib/gpusv") and cfg.socket == Path("/run/gpusv.sock")
    assert cfg.config_path == running.config_path


def test_an_unchanged_config_changes_nothing(tmp_path: Path) -> None:
    running = load(tmp_path, 'admin_group = "ops"\n')
    cfg, applied, restart = reload.plan(running, load(tmp_path, 'admin_group = "ops"\n'))
    assert (cfg, applied, restart) == (running, [], [])


class Recorder:
    """Every method called on it, by name, with its arguments."""

    def __init__(self, calls: list[tuple[str, tuple[Any, ...]]], name: str) -> None:
        self._calls, self._name = calls, name
        self.lines = self  # engine.lines

    def __getattr__(self, method: str) -> Any:
        return lambda *args: self._calls.append((f"{self._name}.{method}", args))


class Parts:
    def __init__(self, cfg: Config, load_config: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.cfg = cfg
        self.load_config = load_config
        for name in ("api", "engine", "hooks", "access", "server"):
            setattr(self, name, Recorder(self.calls, name))


def test_a_config_that_does_not_load_changes_nothing(tmp_path: Path) -> None:
    running = load(tmp_path, "")

    def broken() -> Config:
        raise ConfigError("config: limits.max_connections: must be an integer >= 1, got 0")

    for load_config in (broken, None):
        parts = Parts(running, load_config)
        reload.apply(cast(reload.Parts, parts))
        assert parts.cfg is running and parts.calls == []


def test_a_reload_hands_each_service_its_slice(tmp_path: Path) -> None:
    running = load(tmp_path, "")
    loaded = load(
        tmp_path,
        'admin_group = "ops"\nlog_job_lines_per_s = 0\n'
        "[limits]\nmax_connections = 8\nmax_connections_per_user = 2\nidle_timeout_s = 5\n",
    )
    parts = Parts(running, lambda: loaded)
    reload.apply(cast(reload.Parts, parts))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap = 8 if soft == resource.RLIM_INFINITY else max(1, min(8, soft // 4))
    assert parts.cfg.admin_group == "ops" and parts.cfg.limits.max_connections == 8
    assert parts.calls == [
        ("api.reconfigure", (parts.cfg,)),
        ("hooks.reconfigure", (running.hooks,)),
        ("engine.reconfigure", (0,)),
        ("access.reconfigure", ("ops",)),
        ("server.set_limits", (cap, 2, 5.0)),
    ]
