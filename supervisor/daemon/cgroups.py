"""Memory cgroups, v1 and v2: where we are, OOM-kill counts, and per-job groups.

A cgroup directory tells its own version by its files (v2: memory.max, memory.events;
v1: memory.limit_in_bytes, memory.oom_control), so every function that takes a path
works on either. Writing to a cgroup needs ownership of it: root, or a subtree that
systemd delegated (Delegate=yes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from supervisor.keeper.cgroup import parse_oom_kill

SYS_FS_CGROUP = Path("/sys/fs/cgroup")
DAEMON_LEAF = "daemon"  # the daemon's own leaf under a delegated cgroup
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class Hierarchy:
    """Where the memory controller is mounted."""

    version: Literal[1, 2]
    root: Path


def detect(sys_fs_cgroup: Path = SYS_FS_CGROUP) -> Hierarchy | None:
    """The hierarchy that has the memory controller, or None when there is none."""
    if "memory" in _read(sys_fs_cgroup / "cgroup.controllers").split():
        return Hierarchy(2, sys_fs_cgroup)
    if (sys_fs_cgroup / "memory" / "memory.limit_in_bytes").exists():
        return Hierarchy(1, sys_fs_cgroup / "memory")
    # Hybrid layouts mount v2 at unified/; it has memory only if v1 did not claim it.
    unified = sys_fs_cgroup / "unified"
    if "memory" in _read(unified / "cgroup.controllers").split():
        return Hierarchy(2, unified)
    return None


def parse_proc_cgroup(text: str, version: Literal[1, 2]) -> str | None:
    """The memory cgroup's path ("/a/b") from a /proc/PID/cgroup text, or None."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy_id, controllers, path = parts
        if version == 2 and hierarchy_id == "0" and controllers == "":
            return path
        if version == 1 and "memory" in controllers.split(","):
            return path
    return None


def own_memory_cgroup(
    sys_fs_cgroup: Path = SYS_FS_CGROUP, proc_cgroup: Path = PROC_SELF_CGROUP
) -> Path | None:
    """The directory of this process's memory cgroup, or None when it cannot be found."""
    hierarchy = detect(sys_fs_cgroup)
    if hierarchy is None:
        return None
    rel = parse_proc_cgroup(_read(proc_cgroup), hierarchy.version)
    if rel is None:
        return None
    path = hierarchy.root / rel.lstrip("/")
    return path if path.is_dir() else None


def oom_kill_count(cgroup: Path) -> int | None:
    """Processes the kernel OOM-killed in this cgroup (v1 kernels before 4.13: None)."""
    for name in ("memory.events", "memory.oom_control"):
        count = parse_oom_kill(_read(cgroup / name))
        if count is not None:
            return count
    return None


def memory_current_mb(cgroup: Path) -> int | None:
    """Memory charged to the cgroup now, page cache included."""
    return _bytes_mb(cgroup, "memory.current", "memory.usage_in_bytes")


def memory_peak_mb(cgroup: Path) -> int | None:
    """The cgroup's high-water mark (v2 needs Linux 5.19 for memory.peak)."""
    return _bytes_mb(cgroup, "memory.peak", "memory.max_usage_in_bytes")


def create(parent: Path, name: str, *, limit_bytes: int | None = None) -> Path:
    """A child cgroup, with a memory limit when one is given."""
    path = parent / name
    path.mkdir()
    if limit_bytes is not None:
        set_limit(path, limit_bytes)
    return path


def set_limit(cgroup: Path, limit_bytes: int | None) -> None:
    """Set (None: remove) the hard memory limit, past which the kernel OOM-kills."""
    if (cgroup / "memory.max").exists():
        _write(cgroup / "memory.max", "max" if limit_bytes is None else str(limit_bytes))
    elif (cgroup / "memory.limit_in_bytes").exists():
        _write(cgroup / "memory.limit_in_bytes", str(-1 if limit_bytes is None else limit_bytes))
    else:
        raise FileNotFoundError(
            f"{cgroup} has no memory controller (v2: enable it in the parent's "
            "cgroup.subtree_control)"
        )


def enable_memory_controller(cgroup: Path) -> None:
    """v2: let the children of `cgroup` have memory limits and counters.

    v2 allows controllers in a child only if the parent has no processes of its own
    (except at the root), so a daemon in a delegated cgroup moves itself into a leaf
    first (see move_self_to_leaf).
    """
    control = cgroup / "cgroup.subtree_control"
    if control.exists() and "memory" not in _read(control).split():
        _write(control, "+memory")


def move_self_to_leaf(cgroup: Path, leaf: str = DAEMON_LEAF) -> Path:
    """v2: move every process of `cgroup` into `cgroup/leaf`, freeing `cgroup` for children."""
    target = cgroup / leaf
    target.mkdir(exist_ok=True)
    for pid in pids(cgroup):
        with contextlib.suppress(ProcessLookupError):
            add_pid(target, pid)
    return target


def add_pid(cgroup: Path, pid: int) -> None:
    _write(cgroup / "cgroup.procs", str(pid))


def preexec_join(cgroup: Path) -> Callable[[], None]:
    """A subprocess preexec hook: the child joins `cgroup` before it execs.

    Joining before exec means no byte of the job is ever charged elsewhere. It uses only
    os.open/os.write/os.close, as a hook between fork and exec must.
    """
    procs = os.fsencode(cgroup / "cgroup.procs")

    def join() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    return join


def pids(cgroup: Path) -> list[int]:
    return [int(line) for line in _read(cgroup / "cgroup.procs").split()]


def kill_all(cgroup: Path, *, timeout_s: float = 10.0) -> bool:
    """SIGKILL every process in the cgroup; True once it is empty."""
    kill_file = cgroup / "cgroup.kill"  # v2, Linux 5.14+: atomic, no fork race
    if kill_file.exists():
        _write(kill_file, "1")
    deadline = time.monotonic() + timeout_s
    while remaining := pids(cgroup):
        if time.monotonic() > deadline:
            return False
        for pid in remaining:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return True


def remove(cgroup: Path, *, timeout_s: float = 10.0) -> bool:
    """Kill what is left in the cgroup and remove it; True when it is gone."""
    if not cgroup.exists():
        return True
    kill_all(cgroup, timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            # EBUSY until the killed processes are fully gone from the group.
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _bytes_mb(cgroup: Path, v2_name: str, v1_name: str) -> int | None:
    for name in (v2_name, v1_name):
        text = _read(cgroup / name).strip()
        if text.isdigit():
            return int(text) // (1024 * 1024)
    return None


def _read(path: Path) -> str:
    """A small cgroup or proc file, whole ("" when it cannot be read): one open and one
    read, no text layer (read on every job's start and end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # a long cgroup.procs
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _write(path: Path, text: str) -> None:
    # One write() per value: cgroup files take a whole value per write call.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def unified_mount(sys_fs_cgroup: Path = SYS_FS_CGROUP) -> Path | None:
    """Where cgroup2 is mounted: /sys/fs/cgroup (unified layout), or unified/ (hybrid)."""
    for path in (sys_fs_cgroup, sys_fs_cgroup / "unified"):
        if (path / "cgroup.procs").exists() and (path / "cgroup.controllers").exists():
            return path
    return None


def keeper_roots(
    tag: str, sys_fs_cgroup: Path = SYS_FS_CGROUP, proc_cgroup: Path = PROC_SELF_CGROUP
) -> tuple[Path | None, Path | None]:
    """Where the keepers of this daemon make job cgroups: `tag` beside the daemon's own
    cgroup (its parent when the daemon sits in its `daemon` leaf), on the unified
    hierarchy and on the v1 memory controller where v1 holds it. None where the daemon
    may not write (no root, no Delegate=yes): the keepers then fall back to the tree."""
    text = _read(proc_cgroup)
    found: list[Path | None] = []
    for version, mount in ((2, unified_mount(sys_fs_cgroup)), (1, sys_fs_cgroup / "memory")):
        rel = parse_proc_cgroup(text, version)  # type: ignore[arg-type]
        usable = mount is not None and (version == 2 or (mount / "memory.limit_in_bytes").exists())
        if not usable or rel is None or mount is None:
            found.append(None)
            continue
        base = mount / rel.lstrip("/")
        if base.name == DAEMON_LEAF:
            base = base.parent
        found.append(base / tag if os.access(base, os.W_OK) else None)
    return found[0], found[1]


def settle_delegated(
    sys_fs_cgroup: Path = SYS_FS_CGROUP, proc_cgroup: Path = PROC_SELF_CGROUP
) -> Path | None:
    """Under systemd's Delegate=yes: move the daemon (and any keeper beside it) into the
    `daemon` leaf and let the children of the unit's cgroup have the memory controller,
    so that job cgroups made beside the leaf get memory.peak and memory.events. Returns
    the unit's cgroup; None where the daemon was given none (the root, or not ours)."""
    mount = unified_mount(sys_fs_cgroup)
    rel = parse_proc_cgroup(_read(proc_cgroup), 2)
    if mount is None or rel is None or rel.strip("/") == "":
        return None
    base = mount / rel.lstrip("/")
    if base.name == DAEMON_LEAF:
        base = base.parent
    if not os.access(base / "cgroup.procs", os.W_OK):
        return None
    move_self_to_leaf(base, DAEMON_LEAF)
    with contextlib.suppress(OSError):  # a controller the unit was not given: no memory files
        enable_memory_controller(base)
    return base
