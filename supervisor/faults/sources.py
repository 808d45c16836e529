"""Kernel-log sources: the journal, /dev/kmsg, a followed file, or nothing.

Each source is an async iterator of `KernelLine`s, one kernel message each (a message may
hold newlines, as NVIDIA's multi-line reports do). `follow()` keeps a source alive: when it
dies it is restarted with exponential backoff and the death is reported, never dropped.
The record parsers are pure and tested on their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import anyio
import structlog
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

log = structlog.get_logger(__name__)

KMSG_PATH = "/dev/kmsg"
# -n 0: only what arrives from now on; --all: long fields (NVIDIA dumps) are not nulled.
JOURNAL_ARGV = ("journalctl", "-k", "-f", "-o", "json", "-n", "0", "--all")
FILE_POLL_S = 0.2
_MAX_JOURNAL_LINE = 1 << 20

KINDS = ("auto", "journal", "kmsg", "off")


@dataclass(frozen=True)
class KernelLine:
    text: str
    at: float  # wall-clock epoch seconds: the message's own stamp where known, else read time


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


# --- pure record parsers -------------------------------------------------------------------


@dataclass(frozen=True)
class KmsgRecord:
    priority: int  # syslog level, with the facility in the high bits, as the kernel gives it
    seq: int
    usec: int  # CLOCK_MONOTONIC microseconds since boot
    flags: str
    text: str
    fields: dict[str, str] = field(default_factory=dict)  # SUBSYSTEM=, DEVICE=, ...


_KMSG_HEADER = re.compile(rb"^(\d+),(\d+),(\d+),([^;,]*)[^;]*;(.*)$", re.S)
_KMSG_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(raw: bytes) -> str:
    # /dev/kmsg prints control bytes (newlines, and "\" itself) as \xNN.
    data = _KMSG_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    return data.decode("utf-8", "replace")


def parse_kmsg(data: bytes) -> list[KmsgRecord]:
    """The records in `data`: `prio,seq,usec,flags[,...];text` lines, each followed by
    ` KEY=value` continuation lines. Lines that fit neither are skipped."""
    records: list[KmsgRecord] = []
    current: KmsgRecord | None = None
    for raw in data.split(b"\n"):
        if raw.startswith(b" "):
            key, sep, value = raw[1:].partition(b"=")
            if current is not None and sep:
                current.fields[_unescape(key)] = _unescape(value)
            continue
        m = _KMSG_HEADER.match(raw)
        if m is None:
            current = None
            continue
        priority, seq, usec, flags, text = m.groups()
        current = KmsgRecord(
            int(priority), int(seq), int(usec), flags.decode("ascii", "replace"), _unescape(text)
        )
        records.append(current)
    return records


def boot_to_wall(usec: int, now_wall: float, now_mono: float) -> float:
    """Wall-clock time of a kmsg stamp, given the wall and monotonic clocks read together."""
    return now_wall - max(0.0, now_mono - usec / 1e6)


def parse_journal_entry(raw: bytes | str) -> KernelLine | None:
    """A `journalctl -o json` line as a KernelLine; None for anything that is not an entry."""
    try:
        entry: Any = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # non-UTF-8 or binary: an array of byte values
        try:
            message = bytes(message).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return None
    if not isinstance(message, str):
        return None
    try:
        at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    except (KeyError, TypeError, ValueError):
        at = time.time()
    return KernelLine(message, at)


# --- file ------------------------------------------------------------------------------------


class FileFollower:
    """`tail -F` by polling: starts at the end of an existing file, reads a file that appears
    later from its start, rereads a truncated file, and switches to a rotated-in file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._ident: tuple[int, int] = (0, 0)
        self._partial = b""
        self._at_start = True  # only a file present at start is skipped to its end

    def poll(self) -> list[str]:
        """Complete lines that arrived since the last call."""
        if self._file is None and not self._open():
            return []
        lines = self._read()
        if self._replaced():
            if self._partial:
                lines.append(self._partial.decode("utf-8", "replace"))
            self.close()
            if self._open():
                lines += self._read()
        return [line for line in lines if line.strip()]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._partial = b""

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            self._at_start = False
            return False
        if self._at_start:
            f.seek(0, os.SEEK_END)
        self._at_start = False
        st = os.fstat(f.fileno())
        self._file, self._ident = f, (st.st_dev, st.st_ino)
        return True

    def _read(self) -> list[str]:
        assert self._file is not None
        if os.fstat(self._file.fileno()).st_size < self._file.tell():  # truncated
            self._file.seek(0)
            self._partial = b""
        data = self._file.read()
        if not data:
            return []
        *complete, self._partial = (self._partial + data).split(b"\n")
        return [c.rstrip(b"\r").decode("utf-8", "replace") for c in complete]

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # gone for now: keep the old handle until a new file appears
        return (st.st_dev, st.st_ino) != self._ident


async def file_lines(path: str, *, poll_s: float = FILE_POLL_S) -> AsyncGenerator[KernelLine, None]:
    follower = FileFollower(path)
    try:
        while True:
            for text in follower.poll():
                yield KernelLine(text, time.time())
            await anyio.sleep(poll_s)
    finally:
        follower.close()


# --- /dev/kmsg -------------------------------------------------------------------------------


async def kmsg_lines(path: str = KMSG_PATH) -> AsyncGenerator[KernelLine, None]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # a FIFO cannot seek; /dev/kmsg skips the backlog
            os.lseek(fd, 0, os.SEEK_END)
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
                yield KernelLine(record.text, boot_to_wall(record.usec, now_wall, now_mono))
    finally:
        os.close(fd)


# --- journal ---------------------------------------------------------------------------------


async def journal_lines(argv: Sequence[str] = JOURNAL_ARGV) -> AsyncGenerator[KernelLine, None]:
    # stderr joins stdout: its lines are not JSON, and the last one explains an exit.
    process = await anyio.open_process(
        list(argv), stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT
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
            entry = parse_journal_entry(raw)
            if entry is None:
                noise = raw.decode("utf-8", "replace").strip()[:300] or noise
                continue
            yield entry
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


async def open_source(kind: str, arg: str | None) -> AsyncGenerator[KernelLine, None]:
    """The source a parsed spec names; `auto` is resolved each time it is opened."""
    if kind == "auto":
        kind = await resolve_auto()
        log.info("kernel-log source chosen", source=kind)
    lines: AsyncGenerator[KernelLine, None]
    if kind == "journal":
        lines = journal_lines()
    elif kind == "kmsg":
        lines = kmsg_lines()
    elif kind == "file":
        assert arg is not None
        lines = file_lines(arg)
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
    """
    kind, arg = parse_spec(spec)
    make = factory or open_source
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
