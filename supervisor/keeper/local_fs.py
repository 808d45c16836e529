"""Which of a job's paths the keeper may touch in its own loop: those whose every step
lies on a file system of this machine's own (a disk, memory).

A network file system whose server has gone holds whoever touches it (state D) until
it answers. The keeper's one loop serves a whole card, and a posix_spawn holds the
keeper until the child has exec'd, so a job whose working directory or program is
anywhere else is started by the gated fork instead (spawn.py): its child enters the
directory and searches PATH, and only that job waits. The test is made without touching
anything that may not answer: the mount table says which file system holds a path, and
a step is looked at (lstat, to follow a symbolic link) only once its file system is
known to be local. Answers are kept FOR_S seconds, and forgotten when a mount changes.
"""

from __future__ import annotations

import os
import select
import stat
import time
from collections.abc import Callable
from typing import TypeVar

from .spawn import Spec

FOR_S = 5.0
K = TypeVar("K")
A = TypeVar("A")
_clock = time.monotonic  # a seam: tests move time on
KEPT = 1024  # answers kept at most: past that, all are forgotten at once
_LINKS = 40  # as the kernel's own limit: past it, the kernel fails fast (ELOOP)
_SHEBANGS = 4  # interpreters an exec follows (#!) before the kernel gives up
# Backed by this machine's disks or memory; anything else (nfs, cifs, ceph, lustre,
# gpfs, fuse.*, autofs, 9p, virtiofs...) is taken as one that may not answer.
LOCAL = frozenset(
    {
        *("ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs"),
        *("reiserfs", "nilfs2", "tmpfs", "ramfs", "overlay", "squashfs", "erofs"),
        *("iso9660", "udf", "vfat", "exfat", "ntfs3", "hfsplus", "devtmpfs", "proc", "sysfs"),
    }
)


def mount_types(mountinfo: str) -> dict[str, str]:
    """Each mount point's file system type, the mount on top where several share one."""
    types = {}
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            types[_unescape(fields[4])] = fields[fields.index("-", 6) + 1]
        except (IndexError, ValueError):  # not a mount line: nothing to learn from it
            continue
    return types


def _unescape(point: str) -> str:
    if "\\" not in point:  # the kernel writes space, tab, newline and \ as \ooo
        return point
    raw = point.encode("utf-8", "surrogateescape").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "surrogateescape")


class LocalPaths:
    def __init__(self, mountinfo: str = "/proc/self/mountinfo") -> None:
        self._fd = os.open(mountinfo, os.O_RDONLY | os.O_CLOEXEC)
        self._changed = select.poll()  # a mount or unmount makes it POLLPRI
        self._changed.register(self._fd, select.POLLPRI | select.POLLERR)
        self.types = self._read()
        self._known: dict[tuple[str, str | None, str], tuple[str | None, float]] = {}
        self._paths: dict[str, tuple[str | None, float]] = {}  # far()'s, for other jobs' cwd

    def close(self) -> None:
        os.close(self._fd)

    def start(self, spec: Spec) -> str | None:
        """None when posix_spawn of `spec` touches local file systems only (the working
        directory, each folder its program is searched in, what is exec'd); else the
        first mount it would touch that is not local, as `POINT (TYPE)`."""
        if self._changed.poll(0):
            self.types, self._known, self._paths = self._read(), {}, {}
        return _kept(self._known, (spec.cwd, spec.env.get("PATH"), spec.argv[0]), spec, self._start)

    def where(self, path: str) -> tuple[str, str]:
        """The mount point that holds `path` (absolute, as it reads), and its type."""
        point = path
        while point not in self.types and point != "/":
            point = os.path.dirname(point)
        return point, self.types.get(point, "")

    def far(self, path: str) -> str | None:
        """None when `path` resolves (symbolic links followed) through local file systems
        alone, else the first mount on its way that is not local. A path that does not
        exist is local: its failure is quick."""
        return _kept(self._paths, path, path, self._far)

    def _far(self, path: str) -> str | None:
        done, todo, links = "/", _steps(path), 0
        while todo:
            step = todo.pop()
            if step == "..":
                done = os.path.dirname(done)
                continue
            here = os.path.join(done, step)
            point, kind = self.where(here)
            if kind not in LOCAL:
                return f"{point} ({kind or 'unknown'})"
            try:
                mode = os.lstat(here).st_mode
                target = os.readlink(here) if stat.S_ISLNK(mode) else None
            except OSError:
                return None
            if target is None:
                done = here
                continue
            links += 1
            if links > _LINKS:
                return None
            todo.extend(_steps(target))
            if target.startswith("/"):
                done = "/"
        point, kind = self.where(done)
        return None if kind in LOCAL else f"{point} ({kind or 'unknown'})"

    def _start(self, spec: Spec) -> str | None:
        far = self.far(spec.cwd)
        name = spec.argv[0]
        if far is not None or "/" in name:
            return far or self._exec_far(os.path.join(spec.cwd, name))
        for folder in spec.env.get("PATH", os.defpath).split(os.pathsep):
            path = os.path.join(spec.cwd, folder, name)  # searched in order: each touched
            far = self.far(path)
            if far is not None:
                return far
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return self._exec_far(path)
        return None  # found nowhere: the start fails at once

    def _exec_far(self, path: str) -> str | None:
        """`path` and the interpreters its #! lines name, which exec opens too."""
        for _ in range(_SHEBANGS + 1):
            far = self.far(path)
            if far is not None:
                return far
            try:
                with open(path, "rb") as fh:
                    head = fh.read(256)
            except OSError:
                return None
            words = head[2:].split(b"\n", 1)[0].split() if head.startswith(b"#!") else []
            if not words:
                return None
            path = os.fsdecode(words[0])
        return None

    def _read(self) -> dict[str, str]:
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 65536):
            chunks.append(chunk)
        return mount_types(b"".join(chunks).decode("utf-8", "surrogateescape"))


def _kept(
    known: dict[K, tuple[str | None, float]], key: K, arg: A, work: Callable[[A], str | None]
) -> str | None:
    """`work(arg)`, as found less than FOR_S ago under `key` if it was."""
    now = _clock()
    hit = known.get(key)
    if hit is not None and now - hit[1] < FOR_S:
        return hit[0]
    if len(known) >= KEPT:
        known.clear()
    answer = work(arg)
    known[key] = (answer, now)
    return answer


def _steps(path: str) -> list[str]:
    """The path's names, last first (a stack), without empty ones and `.`."""
    return [s for s in reversed(path.split("/")) if s and s != "."]
