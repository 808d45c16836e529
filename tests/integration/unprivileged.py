"""A user's own gpusvd, started as an ordinary user, for the paths a non-root daemon takes.

One test user per machine, made once (useradd, under a file lock so that parallel
workers agree; it may exist already and is kept). Each daemon runs as that user with
its own $XDG_STATE_HOME and $XDG_RUNTIME_DIR under a directory the user owns, and no
--state-dir or --socket: it finds both where a user's gpusvd does. Without root it gets
no job cgroup (nothing is delegated to it), runs no job as anyone else, and cannot lower
an oom_score_adj below its own. Its clients run as that user too.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from socket import AF_UNIX, SOCK_STREAM
from socket import socket as Socket
from typing import Any

import pytest

from supervisor.client.cli import Client

from .conftest import Daemon, _kill_jobs, _kill_keepers

USER = "gpusvtest-own"
# Where user services often run (systemd --user units at 100 or 200): set by root before
# the user's gpusvd starts, it is also the floor that the daemon and its jobs inherit.
OOM_FLOOR = 200
LOCK = Path(tempfile.gettempdir()) / "gpusvtest-own.lock"
RUNTIME_DEPS = (
    "anyio",
    "aiosqlite",
    "psutil",
    "structlog",
    "sdnotify",
    "logging_journald",
    "prometheus_client",
    "pynvml",
    "typing_extensions",
    "regex",
    "idna",
    "sniffio",
)


@dataclass(frozen=True)
class OwnUser:
    """The test user, an interpreter it may run, and a copy of gpusv it may read."""

    name: str
    uid: int
    gid: int
    home: Path
    base: Path  # 0755, root's: the copied code and every daemon's directory
    python: str

    @property
    def code(self) -> Path:
        return self.base / "code"

    def prefix(self) -> list[str]:
        """setpriv execs: the process is the user's own, with the user's groups."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--"]

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PYTHONPATH": str(self.code),
        }


def ensure_user(name: str = USER) -> pwd.struct_passwd:
    """The user, made if missing; the lock keeps two workers from both running useradd."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
        made = subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", name],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if made.returncode not in (0, 9):  # 9: it exists (made outside this lock)
            raise AssertionError(f"useradd {name}: {made.stderr}")
        return pwd.getpwnam(name)


def copy_code(dest: Path) -> None:
    """gpusv and its runtime dependencies where other users can read them: this
    interpreter and its packages may sit under a directory that only root may enter.
    Compile the copy before a user runs it: the user may not write its __pycache__."""
    import supervisor

    shutil.copytree(
        Path(supervisor.__file__).parent,
        dest / "supervisor",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in RUNTIME_DEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            src = Path(next(iter(spec.submodule_search_locations)))
            shutil.copytree(src, dest / src.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(spec.origin, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _python_for(prefix: list[str], env: dict[str, str]) -> str | None:
    """An interpreter (3.11+) that the user may run, with the copied code."""
    import sys

    probe = "import sys, supervisor.daemon.life.app; sys.exit(sys.version_info < (3, 11))"
    # The system's first: this one may sit under a directory only root may enter.
    for candidate in (
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        os.path.realpath(sys.executable),
    ):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            argv = [*prefix, candidate, "-c", probe]
            if subprocess.run(argv, env=env, capture_output=True, timeout=60).returncode == 0:
                return candidate
    return None


def own_user_setup() -> Iterator[OwnUser]:
    if os.geteuid() != 0:
        pytest.skip("running gpusvd as another user needs root")
    for tool in ("useradd", "setpriv", "choom"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    entry = ensure_user()
    base = Path(tempfile.mkdtemp(prefix="gpusv-own-"))
    try:
        base.chmod(0o755)
        copy_code(base / "code")
        user = OwnUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), base, "")
        python = _python_for(user.prefix(), user.env())
        if python is None:
            pytest.skip("no Python 3.11+ that an ordinary user may run")
        compileall.compile_dir(base / "code", quiet=1)
        for path in (base / "code").rglob("__pycache__"):
            path.chmod(0o755)
        yield OwnUser(user.name, user.uid, user.gid, user.home, base, python)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """This process's effective ids for a moment: a socket connected meanwhile carries
    them as its peer credentials (SO_PEERCRED takes the effective ids at connect)."""
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


class OwnDaemon(Daemon):
    """gpusvd run by an ordinary user, with no --state-dir and no --socket: its state is
    $XDG_STATE_HOME/gpusvd and its socket $XDG_RUNTIME_DIR/gpusvd.sock."""

    def __init__(
        self, root: Path, user: OwnUser, gpus: str | None, config: str, env: dict[str, str]
    ) -> None:
        super().__init__(root, gpus, config, env)
        self.user = user
        self.python = user.python
        self.runtime_dir = root / "run"
        self.state_home = root / "state-home"
        for path in (self.runtime_dir, self.state_home):
            path.mkdir(mode=0o700)
        for path in (root, *root.rglob("*")):
            os.chown(path, user.uid, user.gid)
        self.cgroup: Path | None = None  # a cgroup delegated to the user, to start it in
        self.state = self.state_home / "gpusvd"
        self.socket = self.runtime_dir / "gpusvd.sock"
        self.env = {
            **user.env(),
            "XDG_STATE_HOME": str(self.state_home),
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "PYTHONUNBUFFERED": "1",
            "GPUSV_TEST_ROOT": str(root),
            **env,
        }

    def argv(self) -> list[str]:
        floor = ["choom", "-n", str(OOM_FLOOR), "--"]
        if self.cgroup is not None:  # joined as root, before the ids change
            join = 'echo $$ > "$0" && exec "$@"'
            floor = ["sh", "-c", join, str(self.cgroup / "cgroup.procs"), *floor]
        argv = [*floor, *self.user.prefix(), self.python, "-m", "supervisor.daemon.life.app"]
        argv += ["--config", str(self.config), "--kernel-log", self.kernel_source]
        return argv + (["--simulate-gpus", self.gpus] if self.gpus else [])

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        client = Client(self.socket)
        sock = Socket(AF_UNIX, SOCK_STREAM)
        try:
            with as_user(self.user.uid, self.user.gid):
                sock.connect(str(self.socket))
        except OSError:
            sock.close()
            raise
        client.sock = sock
        try:
            return client.call(request)
        finally:
            client.reset()

    def cli_argv(self) -> list[str]:
        """`gpusv` as the user, with no --socket: it finds the daemon by $XDG_RUNTIME_DIR."""
        return [*self.user.prefix(), self.python, "-m", "supervisor.client.cli"]


def make_own(user: OwnUser) -> Iterator[Callable[..., OwnDaemon]]:
    """make_daemon's counterpart: every daemon, keeper and job it started stops after."""
    daemons: list[OwnDaemon] = []

    def make(
        gpus: str | None = "2x8G",
        config: str = "",
        env: dict[str, str] | None = None,
        start: bool = True,
    ) -> OwnDaemon:
        d = OwnDaemon(user.base / uuid.uuid4().hex[:10], user, gpus, config, env or {})
        daemons.append(d)
        return d.start() if start else d  # type: ignore[return-value]

    yield make
    for d in daemons:
        if d.proc is not None and d.proc.poll() is None:
            d.kill9()
        _kill_keepers(d)
        _kill_jobs(d)
        _kill_strays(d)
        shutil.rmtree(d.root, ignore_errors=True)


def _kill_strays(d: OwnDaemon) -> None:
    """The user's processes still working in the daemon's directory: a job's escapee
    that cleared its environment is out of _kill_jobs's reach (and of its keeper's)."""
    import psutil

    for proc in psutil.process_iter(["uids", "cwd"]):
        uids, cwd = proc.info["uids"], proc.info["cwd"] or ""
        if uids is not None and uids.real == d.user.uid and f"{cwd}/".startswith(f"{d.root}/"):
            with contextlib.suppress(psutil.Error):
                proc.kill()
