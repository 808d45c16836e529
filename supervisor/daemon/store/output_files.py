"""Job output files (STATE/logs/ID.out, ID.err and the index of their order, ID.idx):
attempt headers, reading, the size cap and the retention sweep.

A job's keeper writes its files (relaying its pipes, supervisor/keeper/output.py; they
outlive the daemon), so a cap cannot stop a write: past `logs.max_size` the middle of
the file is collapsed away in place (fallocate's COLLAPSE_RANGE keeps appends going),
the head and the tail are kept, a marker at the end of the head says how much was cut,
and the index records the cut. Both streams read as one, in order: output_merge.py.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import structlog

from supervisor.core.jobs import JobState
from supervisor.daemon.store import output_merge as merge
from supervisor.keeper.output import CUT_ERR, CUT_OUT, HEADER_ERR, HEADER_OUT, RECORD
from supervisor.wire.shapes import LogsReply

if TYPE_CHECKING:
    from supervisor.daemon.config import Config

log = structlog.get_logger("gpusvd.logs")

_FALLOC_FL_COLLAPSE_RANGE = 0x08
_MARKER = "\n[gpusv: {:>16} bytes of output cut here to keep the log under logs.max_size]\n"
MARKER_LEN = len(_MARKER.format(0))
_MARKER_RE = re.compile(rb"\[gpusv: +(\d+) bytes of output cut here")
_READ_BACK = 64 * 1024
_NAME = re.compile(r"^(\d+)\.(?:out|err|idx)$")
_OPEN = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def logs_dir(state_dir: Path) -> Path:
    """Where the jobs' output files live: one `ID.out` and `ID.err` each."""
    return state_dir / "logs"


def header(job_id: int, attempt: int, started_at: str) -> bytes:
    """The line between two attempts' output in the same file."""
    return f"\n--- gpusv: job {job_id}, attempt {attempt}, started {started_at} ---\n".encode()


def index_of(path: Path) -> Path:
    """`ID.idx`, the order of `ID.out`'s and `ID.err`'s writes."""
    return path.with_suffix(".idx")


def write_header(out: Path, err: Path, data: bytes) -> None:
    """The header between two attempts, in both files, recorded in the index first: a
    reader that finds the records before the bytes waits for them (output_merge.py)."""
    fds: list[int] = []
    with contextlib.suppress(OSError):  # no log yet, or unwritable: the job still runs
        try:
            for path in (out, err, index_of(out)):
                fds.append(os.open(path, _OPEN, 0o600))
            ends = [os.fstat(fd).st_size + len(data) for fd in fds[:2]]
            records = RECORD.pack(HEADER_OUT, len(data), ends[0])
            os.write(fds[2], records + RECORD.pack(HEADER_ERR, len(data), ends[1]))
            for fd in fds[:2]:
                os.write(fd, data)
        finally:
            for fd in fds:
                os.close(fd)


def chunk_reply(
    path: Path, offset: int, limit: int, tail_lines: int | None, state: JobState
) -> LogsReply:
    """`gpusv logs`' answer: a chunk of the file from `offset` (or its tail), and whether
    the job's output is complete."""
    data, start, size = read(path, offset, limit, tail_lines)
    return {
        "ok": True,
        "data_b64": base64.b64encode(data).decode(),
        "offset": start + len(data),
        "size": size,
        "done": state.terminal and start + len(data) >= size,
        "state": state.value,
    }


def merged_reply(
    out: Path, offset: int, limit: int, tail_lines: int | None, state: JobState
) -> LogsReply:
    """`gpusv logs` of both streams: segments of the merged stream from `offset` (a
    position in it, output_merge.py) or from its last `tail_lines` lines."""
    fds, sizes = merge.open_files({merge.OUT: out, merge.ERR: out.with_suffix(".err")})
    try:
        try:
            index = index_of(out).read_bytes()
        except FileNotFoundError:
            index = b""
        lay = merge.layout(index, sizes)
        if tail_lines is not None:
            offset = merge.tail_position(lay, fds, tail_lines)
        segments, offset = merge.read(lay, fds, offset, limit)
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)
    return {
        "ok": True,
        "data_b64": "",
        "segments": [
            {"stream": label, "data_b64": base64.b64encode(data).decode()}
            for label, data in segments
        ],
        "offset": offset,
        "size": lay.size,
        "done": state.terminal and offset >= lay.size,
        "state": state.value,
    }


def read(path: Path, offset: int, limit: int, tail_lines: int | None) -> tuple[bytes, int, int]:
    """(data, its offset, the file's size) from `offset`, or from the start of the last
    `tail_lines` lines. An offset past the end (the file was cut meanwhile) restarts at
    the cut file's tail."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", 0, 0
    try:
        size = os.fstat(fd).st_size
        if tail_lines is not None:
            offset = _tail_offset(fd, size, tail_lines)
        elif offset > size:
            offset = max(0, size - limit)
        return os.pread(fd, limit, offset), offset, size
    finally:
        os.close(fd)


def _tail_offset(fd: int, size: int, lines: int) -> int:
    """Where the last `lines` lines start (a final newline ends a line, it starts none)."""
    if lines <= 0:
        return size
    end, seen = size, 0
    if size and os.pread(fd, 1, size - 1) == b"\n":
        end -= 1
    while end > 0:
        start = max(0, end - _READ_BACK)
        block = os.pread(fd, end - start, start)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            seen += 1
            if seen == lines:
                return start + i + 1
        end = start
    return 0


def _collapse(fd: int, offset: int, length: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return bool(libc.fallocate(fd, _FALLOC_FL_COLLAPSE_RANGE, offset, length) == 0)


def _copy_tail(fd: int, head: int, size: int, keep: int) -> None:
    """Where collapsing is not supported: move the tail after the head and truncate. What
    the job appends during the copy is lost; the cap holds either way."""
    tail = os.pread(fd, keep, size - keep)
    os.pwrite(fd, tail, head)
    os.ftruncate(fd, head + len(tail))


def cap(path: Path, max_bytes: int) -> int:
    """Cut the middle out of a log larger than `max_bytes`; the bytes cut (0: none)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if st.st_size <= max_bytes:
            return 0
        block = max(st.st_blksize, 4096)
        head = max(block, (max_bytes // 2) // block * block)
        cut = (st.st_size - max_bytes // 2 - head) // block * block
        if cut <= 0:
            return 0
        before = _MARKER_RE.search(os.pread(fd, MARKER_LEN, head - MARKER_LEN))
        total = cut + (int(before.group(1)) if before else MARKER_LEN)
        if not _collapse(fd, head, cut):
            if ctypes.get_errno() not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return 0
            _copy_tail(fd, head, st.st_size, st.st_size - head - cut)
        os.pwrite(fd, _MARKER.format(total).encode(), head - MARKER_LEN)
        _record_cut(path, head, cut)
        return cut
    finally:
        os.close(fd)


def _record_cut(path: Path, head: int, cut: int) -> None:
    """The merged reading skips what was cut (output_merge.py)."""
    kind = CUT_ERR if path.suffix == ".err" else CUT_OUT
    with contextlib.suppress(OSError):
        fd = os.open(index_of(path), _OPEN, 0o600)
        try:
            os.write(fd, RECORD.pack(kind, cut, head))
        finally:
            os.close(fd)


def expired(
    files: Iterable[tuple[Path, float]], active: set[int], now: float, retention_s: float
) -> list[Path]:
    """The log files to delete: of jobs no longer active, untouched for `retention_s`
    (0 keeps them forever). Pure."""
    if retention_s <= 0:
        return []
    out = []
    for path, mtime in files:
        match = _NAME.match(path.name)
        if match and int(match.group(1)) not in active and now - mtime > retention_s:
            out.append(path)
    return out


def scan(logs_dir: Path) -> list[tuple[Path, float, int]]:
    """(path, mtime, bytes on disk) of every job log."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(logs_dir):
            if _NAME.match(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    out.append((Path(entry.path), st.st_mtime, st.st_blocks * 512))
    return out


def remove(logs_dir: Path, job_ids: Iterable[int]) -> int:
    """Delete these jobs' logs; the bytes of disk freed."""
    freed = 0
    for job_id in job_ids:
        for suffix in ("out", "err", "idx"):
            path = logs_dir / f"{job_id}.{suffix}"
            with contextlib.suppress(FileNotFoundError):
                freed += os.lstat(path).st_blocks * 512
                path.unlink()
    return freed


async def disk_use(logs_dir: Path) -> dict[str, int]:
    files = await anyio.to_thread.run_sync(scan, logs_dir)
    return {"files": len(files), "disk_mb": -(-sum(f[2] for f in files) // (1 << 20))}


def sweep(logs_dir: Path, active: set[int], now: float, retention_s: float) -> int:
    """Delete expired logs; how many files went."""
    files = [(path, mtime) for path, mtime, _ in scan(logs_dir)]
    gone = expired(files, active, now, retention_s)
    for path in gone:
        path.unlink(missing_ok=True)
    return len(gone)


async def retention_task(
    cfg: Config, active: Callable[[], set[int]], *, every_s: float = 3600, retry_s: float = 60
) -> None:
    """Delete finished jobs' logs older than logs.retention, at start and then hourly. A
    sweep that fails (no descriptor left, the directory unreadable) is tried again
    later: a housekeeping chore must never take the daemon down."""
    folder, retention_s = logs_dir(cfg.state_dir), cfg.logs.retention
    while True:
        try:
            gone = await anyio.to_thread.run_sync(sweep, folder, active(), time.time(), retention_s)
        except OSError as exc:
            log.warning("old job logs not swept; trying again", error=str(exc), in_s=retry_s)
            await anyio.sleep(retry_s)
            continue
        if gone:
            log.info("old job logs deleted", files=gone)
        await anyio.sleep(every_s)
