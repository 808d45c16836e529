"""Starting a keeper, and a small blocking client for its socket.

gpusvd's own client is asynchronous (supervisor.daemon.running.keepers); this one serves tools,
the benchmark and tests, and holds the wire format's two rules: one JSON object a line,
replies matched to requests by `id`, events (`"event"` set) in between.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.keeper import scope
from supervisor.wire.framing import encode

EXIT_HELD = 3  # another keeper holds the directory: it serves


class KeeperError(Exception):
    """A keeper's typed error; `transient`: trying again may work (a spawn's EAGAIN)."""

    def __init__(self, code: str, message: str, *, transient: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.transient = transient

    @classmethod
    def of(cls, answer: dict[str, Any]) -> KeeperError:
        """From an answer that is not ok."""
        error = answer.get("error") or {}
        code, message = str(error.get("code", "?")), str(error.get("message", ""))
        return cls(code, message, transient=error.get("transient") is True)


def launch_argv(
    home: Path, cgroup2: Path | None = None, memcg: Path | None = None, python: str = ""
) -> list[str]:
    argv = [python or sys.executable, "-m", "supervisor.keeper", str(home), "--detach"]
    if cgroup2 is not None:
        argv += ["--cgroup2", str(cgroup2)]
    if memcg is not None:
        argv += ["--memcg", str(memcg)]
    return argv


def launch(home: Path, cgroup2: Path | None = None, memcg: Path | None = None) -> None:
    """Start a keeper for `home` unless one serves it; return once its socket listens.
    It runs in a session of its own and is nobody's child once started: it outlives us.
    Under systemd it starts in a scope of its own, its jobs' cgroups inside (scope.py)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    planned = scope.plan(cgroup2)
    runner = scope.systemd_run() if planned is not None else None
    if planned is not None and runner is not None:
        argv = launch_argv(home, planned.jobs_root, memcg)
        if planned.cgroup.is_dir():  # its keeper serves, or jobs of a dead one are there
            code = _run(home, argv, join=planned.join_target())
        else:
            code = _run(home, planned.argv(runner, argv))
        if code in (0, EXIT_HELD):
            return
        # The manager refused the scope (its reason is in the log): beside the daemon.
    # Our own interpreter, by our own image: a daemon run as an ordinary user may
    # execute a binary whose path it may not search (a root-owned pyenv).
    own = "/proc/self/exe" if Path("/proc/self/exe").exists() else None
    code = _run(home, launch_argv(home, cgroup2, memcg), executable=own)
    if code not in (0, EXIT_HELD):
        raise KeeperError("start", f"keeper exited {code}; see {home / 'log'}")


def _run(
    home: Path, argv: list[str], executable: str | None = None, join: Path | None = None
) -> int:
    with open(home / "log", "ab") as log:
        done = subprocess.run(
            argv,
            executable=executable,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=None if join is None else _joiner(join),
            check=False,
        )
    return done.returncode


def _joiner(cgroup: Path) -> Callable[[], None]:
    """A hook between fork and exec (os calls only): the child joins `cgroup`; where it
    may not, it starts where we are, as a keeper without a scope does."""
    procs = os.fsencode(cgroup / "cgroup.procs")

    def join() -> None:
        with contextlib.suppress(OSError):
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

    return join


class Connection:
    """One blocking connection; events that arrive before a reply wait in `events`."""

    def __init__(self, path: Path, timeout_s: float | None = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(str(path))
        self.reader = self.sock.makefile("rb")
        self.events: deque[dict[str, Any]] = deque()
        self._next = 0

    def send(self, op: str, **fields: Any) -> int:
        self._next += 1
        self.sock.sendall(_line({"id": self._next, "op": op, **fields}))
        return self._next

    def receive(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise ConnectionError("the keeper closed the connection")
        message: dict[str, Any] = json.loads(line)
        return message

    def reply(self, rid: int) -> dict[str, Any]:
        while True:
            message = self.receive()
            if "event" in message:
                self.events.append(message)
            elif message.get("id") == rid:
                return message

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; raise KeeperError on an error."""
        answer = self.reply(self.send(op, **fields))
        if not answer.get("ok"):
            raise KeeperError.of(answer)
        return answer

    def event(self) -> dict[str, Any]:
        return self.events.popleft() if self.events else self.receive()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_line = encode  # the wire's one encoding, on every hop


def pid_of(home: Path) -> int | None:
    """The keeper serving `home`, from a ping; None when none answers."""
    try:
        with Connection(home / "sock", timeout_s=5.0) as conn:
            return int(conn.call("ping")["pid"])
    except (OSError, KeeperError, ValueError):
        return None
