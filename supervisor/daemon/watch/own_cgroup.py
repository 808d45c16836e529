"""The memory limit of the cgroup gpusvd itself runs in (a Slurm job, a Kubernetes pod, a
systemd unit with MemoryMax=), cgroup v1 or v2.

Inside such an allocation MemTotal is still the host's, and a ledger sized by it would
admit jobs that the kernel's cgroup OOM killer then ends: the ledger must be no larger
than the allocation.
"""

from __future__ import annotations

import os
from pathlib import Path

_MB = 1024 * 1024
_V1_UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2**63 - 1


def memory_limit_mb(proc: Path = Path("/proc/self")) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors, in MiB; None
    when there is none (or no cgroup filesystem can be read)."""
    limits = [
        limit for directory, name in _memory_dirs(proc) for limit in _limits_up(directory, name)
    ]
    return min(limits) // _MB if limits else None


def _memory_dirs(proc: Path) -> list[tuple[Path, str]]:
    """(cgroup directory, its limit file) for each hierarchy with a memory controller."""
    try:
        membership = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in membership:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and not controllers:
            candidates, name = _mounts(mounts, "cgroup2", None), "memory.max"
        elif "memory" in controllers.split(","):
            candidates, name = _mounts(mounts, "cgroup", "memory"), "memory.limit_in_bytes"
        else:
            continue
        directory = _holding(candidates, path)
        if directory is not None:
            found.append((directory, name))
    return found


def _mounts(lines: list[str], fstype: str, option: str | None) -> list[tuple[str, str]]:
    """(root within the hierarchy, mount point) of each mount of a cgroup filesystem in
    mountinfo, in its order."""
    found = []
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if fields[sep + 1] != fstype:
            continue
        options = fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        if option is None or option in options:
            found.append((fields[3], fields[4]))
    return found


def _holding(mounts: list[tuple[str, str]], path: str) -> Path | None:
    """The directory of cgroup `path` under the first mount that shows it. A hierarchy
    may be mounted more than once, and a mount may be out of reach: one made outside
    this cgroup namespace has a root of "/.." (its path cannot be mapped), and one
    covered by a later mount on the same point has no such directory to read."""
    for root, point in mounts:
        if root.startswith("/.."):
            continue
        inside = path == root or path.startswith(root.rstrip("/") + "/")
        relative = os.path.relpath(path, root) if inside else path
        directory = Path(point) / relative.lstrip("/")
        if directory.is_dir():
            return directory
    return None


def _limits_up(directory: Path, name: str) -> list[int]:
    """The limit of `directory` and of each parent that has the file (up to the mount)."""
    out = []
    current = directory
    while (current / name).exists():
        try:
            text = (current / name).read_text().strip()
        except OSError:
            break
        if text.isdigit() and int(text) < _V1_UNLIMITED:
            out.append(int(text))
        if current.parent == current:
            break
        current = current.parent
    return out
