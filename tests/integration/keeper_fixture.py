"""A real keeper in a short temporary directory, with real cgroups, removed afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from supervisor.keeper import cgroup
from supervisor.keeper.client import Connection, launch, pid_of

UNIFIED = Path("/sys/fs/cgroup/unified")
MEMCG = Path("/sys/fs/cgroup/memory")
PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Keeper:
    def __init__(self, home: Path, v2: Path | None, memcg: Path | None) -> None:
        self.home, self.v2, self.memcg = home, v2, memcg
        self.conns: list[Connection] = []

    def start(self) -> Keeper:
        launch(self.home, self.v2, self.memcg)
        return self

    @property
    def pid(self) -> int:
        pid = pid_of(self.home)
        assert pid is not None, "the keeper does not answer"
        return pid

    def connect(self, attach: bool = True) -> Connection:
        conn = Connection(self.home / "sock")
        self.conns.append(conn)
        if attach:
            conn.call("attach")
        return conn

    def job(self, job: int, argv: list[str], attempt: int = 1, **extra: Any) -> dict[str, Any]:
        out = self.home / f"job-{job}-{attempt}.out"
        spec: dict[str, Any] = {
            "job": job,
            "attempt": attempt,
            "argv": argv,
            "cwd": "/tmp",
            "env": dict(PATH),
            "stdout": str(out),
            "stderr": str(out),
        }
        spec.update(extra)
        return spec

    def output(self, job: int, attempt: int = 1) -> str:
        return (self.home / f"job-{job}-{attempt}.out").read_text()

    def kill(self) -> None:
        """SIGKILL the keeper, leaving its jobs, journal and cgroups as they are."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.conns = []
        pid = pid_of(self.home)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(pid), "the keeper to die")

    def stop(self) -> None:
        self.kill()
        for root in (self.v2, self.memcg):
            if root is not None and root.exists():
                cgroup.remove_tree(root)


@contextlib.contextmanager
def keeper(cgroups: bool = True, memcg_limit: int | None = None) -> Iterator[Keeper]:
    """A keeper (started) whose job cgroups go under fresh roots of their own."""
    home = Path(tempfile.mkdtemp(prefix="k-", dir="/tmp")) / "keeper"
    tag = f"gpusv-test-{uuid.uuid4().hex[:10]}"
    v2 = UNIFIED / tag if cgroups and (UNIFIED / "cgroup.procs").exists() else None
    memcg = MEMCG / tag if cgroups and (MEMCG / "memory.limit_in_bytes").exists() else None
    if memcg is not None and memcg_limit is not None:
        memcg.mkdir()
        (memcg / "memory.limit_in_bytes").write_text(str(memcg_limit))
    k = Keeper(home, v2, memcg)
    try:
        yield k.start()
    finally:
        k.stop()
        shutil.rmtree(home.parent, ignore_errors=True)
