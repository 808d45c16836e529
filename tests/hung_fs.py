"""A real file system that does not answer, as a hung NFS server leaves one: a FUSE
mount whose device nobody reads. The kernel holds every access to it (in `fuse_get_req`,
state D, killable) until the device is closed, after which each access fails with
ENOTCONN. Needs root and /dev/fuse; no FUSE library: the mount is one system call."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

MNT_DETACH = 2
_NOSUID_NODEV = 2 | 4


def why_not() -> str | None:
    """Why a hung mount cannot be made here, or None."""
    if os.geteuid() != 0:
        return "mounting a FUSE file system needs root here"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    with open("/proc/filesystems") as fh:
        if not any(line.split()[-1] == "fuse" for line in fh if line.strip()):
            return "the kernel has no FUSE"
    return None


class Hung:
    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        """The server is gone for good: whatever waits on it fails now, with ENOTCONN."""
        if self._fd >= 0:
            os.close(self._fd)  # the connection is aborted
            self._fd = -1


@contextlib.contextmanager
def hung_mount(where: Path) -> Iterator[Hung]:
    """`where` (made, empty) with a file system that never answers mounted on it;
    released and detached afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
        if (
            libc.mount(
                b"gpusv-test-hung",
                bytes(where),
                b"fuse.gpusv-test-hung",
                _NOSUID_NODEV,
                options.encode(),
            )
            != 0
        ):
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount on {where}: {os.strerror(errno)}")
    except BaseException:
        os.close(fd)
        raise
    hung = Hung(where, fd)
    try:
        yield hung
    finally:
        hung.release()
        libc.umount2(bytes(where), MNT_DETACH)
