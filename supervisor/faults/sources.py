"""Kernel-log sources: the journal, /dev/kmsg, a followed file, or nothing.

Each source is an async iterator of `KernelLine`s, one kernel message each (a message may
hold newlines, as NVIDIA's multi-line reports do). `follow()` keeps a source alive: when it
dies it is restarted with exponential backoff and the death is reported, never dropped.
The record parsers are pure and tested on their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing

import anyio
import structlog
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor.faults.filefollow import FileFollower, file_lines
from supervisor.faults.records import (
    KernelLine,
    KmsgRecord,
    Resume,
    boot_to_wall,
    journal_entry,
    kmsg_line,
    parse_journal_entry,
    parse_kmsg,
)

__all__ = [
    "FileFollower",
    "KernelLine",
    "KmsgRecord",
    "Resume",
    "boot_to_wall",
    "follow",
    "open_source",
    "parse_journal_entry",
    "parse_kmsg",
    "parse_spec",
]

log = structlog.get_logger(__name__)

KMSG_PATH = "/dev/kmsg"
# -n 0: only what arrives from now on (at first start; a restart goes on after the last
# entry read, by its cursor); --all: long fields (NVIDIA dumps) are not nulled.
JOURNAL_ARGV = ("journalctl", "-k", "-f", "-o", "json", "-n", "0", "--all")
_MAX_JOURNAL_LINE = 1 << 20

KINDS = ("auto", "journal", "kmsg", "off")


class SourceDied(RuntimeError):
    """A source ended on its own (a process exited, a pipe closed)."""


SourceFactory = Callable[[str, str | None], AsyncGenerator[KernelLine, None]]
RestartHook = Callable[[str, BaseException], None]


def parse_spec(spec: str) -> tuple[str, str | None]:
    """("auto"|"journal"|"kmsg"|"off", None) or ("file", PATH); ValueError otherwise."""
    text = spec.strip()
    if text in KINDS:
        return text, None
    if text.startswith("file:"):
        path = text[len("file:") :]
        if not path:
            raise ValueError("kernel_log 'file:' needs a path, e.g. file:/var/log/kern.log")
        return "file", path
    raise ValueError(f"kernel_log {spec!r} is not one of: auto, journal, kmsg, off, file:PATH")


# --- /dev/kmsg -------------------------------------------------------------------------------


async def kmsg_lines(
    path: str = KMSG_PATH, *, resume: Resume | None = None
) -> AsyncGenerator[KernelLine, None]:
    """/dev/kmsg from now on; after a restart (`resume` holds a sequence number), from the
    oldest record the ring still holds, skipping those already read."""
    resume = resume if resume is not None else Resume()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if resume.kmsg_seq is None:
            _skip_backlog(fd, resume)
        pending = b""
        while True:
            try:
                data = os.read(fd, 16384)  # /dev/kmsg: exactly one record per read
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            except BrokenPipeError:
                continue  # EPIPE: the ring overwrote unread records; go on from the oldest kept
            if not data:
                raise SourceDied(f"{path}: end of file")
            *complete, pending = (pending + data).split(b"\n")
            now_wall, now_mono = time.time(), time.monotonic()
            for record in parse_kmsg(b"\n".join(complete)):
                if _seen(record, resume):
                    continue
                yield kmsg_line(record, now_wall, now_mono)
    finally:
        os.close(fd)


def _skip_backlog(fd: int, resume: Resume) -> None:
    """Past what the kernel logged before we started. On the device, by reading it through
    (one record per read), so that the last sequence number is known even if the source
    dies before a new record comes: a restart then loses nothing logged in between."""
    if not stat.S_ISCHR(os.fstat(fd).st_mode):
        with contextlib.suppress(OSError):  # a FIFO cannot seek
            os.lseek(fd, 0, os.SEEK_END)
        return
    while True:
        try:
            data = os.read(fd, 16384)
        except BlockingIOError:
            return
        except BrokenPipeError:
            continue
        if not data:
            return
        for record in parse_kmsg(data):
            resume.kmsg_seq = record.seq


def _seen(record: KmsgRecord, resume: Resume) -> bool:
    last = resume.kmsg_seq
    if last is not None and record.seq <= last:
        return True
    if last is not None and record.seq > last + 1:
        resume.skipped += record.seq - last - 1
        log.warning(
            "kernel ring overwrote records before they were read", lost=record.seq - last - 1
        )
    resume.kmsg_seq = record.seq
    return False


# --- journal ---------------------------------------------------------------------------------


def journal_argv(argv: Sequence[str], cursor: str | None) -> list[str]:
    """`argv`, going on after `cursor` instead of from now when there is one."""
    out = list(argv)
    if cursor is None:
        return out
    if "-n" in out:
        at = out.index("-n")
        del out[at : at + 2]
    return [*out, f"--after-cursor={cursor}"]


async def journal_lines(
    argv: Sequence[str] = JOURNAL_ARGV, *, resume: Resume | None = None
) -> AsyncGenerator[KernelLine, None]:
    resume = resume if resume is not None else Resume()
    # stderr joins stdout: its lines are not JSON, and the last one explains an exit.
    process = await anyio.open_process(
        journal_argv(argv, resume.journal_cursor),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        stream = BufferedByteReceiveStream(process.stdout)
        noise = ""
        while True:
            try:
                raw = await stream.receive_until(b"\n", _MAX_JOURNAL_LINE)
            except (anyio.IncompleteRead, anyio.EndOfStream):
                break
            entry = journal_entry(raw)
            if entry is None:
                noise = raw.decode("utf-8", "replace").strip()[:300] or noise
                continue
            line, cursor = entry
            resume.journal_cursor = cursor or resume.journal_cursor
            yield line
        status = await process.wait()
        raise SourceDied(f"{argv[0]} exited with status {status}" + (f": {noise}" if noise else ""))
    finally:
        await _stop(process)


async def _stop(process: Process) -> None:
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
            with anyio.move_on_after(3):
                await process.wait()
        if process.returncode is None:
            process.kill()
        await process.aclose()


# --- off, auto -------------------------------------------------------------------------------


async def off_lines() -> AsyncGenerator[KernelLine, None]:
    await anyio.sleep_forever()
    return
    yield  # an async generator that never yields


async def resolve_auto(
    *, systemd_dir: str = "/run/systemd/system", kmsg_path: str = KMSG_PATH
) -> str:
    """journal under systemd when journalctl shows kernel messages, else kmsg, else off."""
    systemd = shutil.which("journalctl") and os.path.isdir(systemd_dir)
    if systemd and await _journal_has_kernel_messages():
        return "journal"
    try:
        os.close(os.open(kmsg_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        return "kmsg"
    except OSError as exc:
        log.warning(
            "no kernel log readable: GPU hangs are detected only by the no-progress watchdog",
            kmsg_error=str(exc),
            hint="run as root, or set kernel_log = 'file:/var/log/kern.log'",
        )
        return "off"


async def _journal_has_kernel_messages() -> bool:
    with anyio.move_on_after(10):
        result = await anyio.run_process(
            ["journalctl", "-k", "-n", "1", "-o", "json", "-q"], check=False
        )
        return result.returncode == 0 and bool(result.stdout.strip())
    return False


async def open_source(
    kind: str, arg: str | None, resume: Resume | None = None
) -> AsyncGenerator[KernelLine, None]:
    """The source a parsed spec names; `auto` is resolved each time it is opened. A source
    opened again with the same `resume` goes on where the last one stopped."""
    if kind == "auto":
        kind = await resolve_auto()
        log.info("kernel-log source chosen", source=kind)
    lines: AsyncGenerator[KernelLine, None]
    if kind == "journal":
        lines = journal_lines(resume=resume)
    elif kind == "kmsg":
        lines = kmsg_lines(resume=resume)
    elif kind == "file":
        assert arg is not None
        lines = file_lines(arg, resume=resume)
    else:
        lines = off_lines()
    async with aclosing(lines):
        async for line in lines:
            yield line


async def follow(
    spec: str,
    *,
    on_restart: RestartHook | None = None,
    factory: SourceFactory | None = None,
    min_backoff_s: float = 0.5,
    max_backoff_s: float = 30.0,
) -> AsyncGenerator[KernelLine, None]:
    """Lines from the source `spec` names, forever; a source that dies is restarted.

    Each death is passed to `on_restart(spec, error)` before the backoff sleep (0.5 s
    doubling to 30 s; back to 0.5 s after a source lived 30 s). Without a hook it is logged.
    A restarted source goes on after the last line read: none is lost or read twice, as far
    as the kernel kept them (journal cursor, kmsg sequence number, file offset).
    """
    kind, arg = parse_spec(spec)
    resume = Resume()  # one for the life of follow(): every restart goes on from it
    make = factory or (lambda k, a: open_source(k, a, resume))
    delay: float | None = None
    while True:
        started = time.monotonic()
        error: BaseException
        try:
            async with aclosing(make(kind, arg)) as lines:
                async for line in lines:
                    yield line
            error = SourceDied(f"kernel-log source {spec!r} ended")
        except Exception as exc:  # cancellation and GeneratorExit are not Exceptions
            error = exc
        ran_s = time.monotonic() - started
        delay = restart_delay(delay, ran_s, min_backoff_s, max_backoff_s)
        _report(spec, error, delay, on_restart)
        await anyio.sleep(delay)


def restart_delay(previous: float | None, ran_s: float, low: float, high: float) -> float:
    """The wait before the next restart: doubling from `low` to `high`, and back to `low`
    once a source ran for `high` seconds (it was healthy; this is a new failure)."""
    if previous is None or ran_s >= high:
        return low
    return min(previous * 2, high)


def _report(spec: str, error: BaseException, backoff: float, hook: RestartHook | None) -> None:
    if hook is not None:
        hook(spec, error)
    else:
        log.warning(
            "kernel-log source died; restarting", source=spec, error=repr(error), retry_in_s=backoff
        )
