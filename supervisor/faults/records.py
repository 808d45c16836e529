"""Kernel-log records: the line type every source yields, and the pure parsers of the
journal's and /dev/kmsg's record formats, with what lets a source resume where it stopped."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from supervisor.gpus.base import normalize_bus_id


@dataclass(frozen=True)
class KernelLine:
    text: str
    at: float  # wall-clock epoch seconds: the message's own stamp where known, else read time
    # The PCI device the kernel filed the message under (journal _KERNEL_DEVICE, kmsg
    # DEVICE=), normalized; None when it named none. Lines such as NVRM's "Xid (PCI:…)"
    # carry the bus id in their text; dev_printk lines of other drivers may not.
    device: str | None = field(default=None, compare=False)


@dataclass
class Resume:
    """Where a source stopped, so that its next start goes on from there: the kernel keeps
    logging while a source restarts, and a burst of Xids comes exactly then."""

    journal_cursor: str | None = None
    kmsg_seq: int | None = None  # the last record read
    file_offset: tuple[tuple[int, int], int] | None = None  # ((st_dev, st_ino), offset)
    skipped: int = 0  # records the kmsg ring overwrote before they could be read


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


def device_bus_id(device: object) -> str | None:
    """The PCI bus id in a kernel device reference: "+pci:0000:3b:00.0" (kmsg DEVICE=,
    journal _KERNEL_DEVICE) -> "0000:3b:00.0"; None for any other kind of device."""
    if not isinstance(device, str) or not device.startswith("+pci:"):
        return None
    try:
        return normalize_bus_id(device[len("+pci:") :])
    except ValueError:
        return None


def boot_to_wall(usec: int, now_wall: float, now_mono: float) -> float:
    """Wall-clock time of a kmsg stamp, given the wall and monotonic clocks read together."""
    return now_wall - max(0.0, now_mono - usec / 1e6)


def kmsg_line(record: KmsgRecord, now_wall: float, now_mono: float) -> KernelLine:
    at = boot_to_wall(record.usec, now_wall, now_mono)
    return KernelLine(record.text, at, device_bus_id(record.fields.get("DEVICE")))


def journal_entry(raw: bytes | str) -> tuple[KernelLine, str | None] | None:
    """A `journalctl -o json` line as a KernelLine and its cursor; None for a non-entry."""
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
    cursor = entry.get("__CURSOR")
    line = KernelLine(message, at, device_bus_id(entry.get("_KERNEL_DEVICE")))
    return line, cursor if isinstance(cursor, str) else None


def parse_journal_entry(raw: bytes | str) -> KernelLine | None:
    """A `journalctl -o json` line as a KernelLine; None for anything that is not an entry."""
    parsed = journal_entry(raw)
    return None if parsed is None else parsed[0]
