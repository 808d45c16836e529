"""The keeper's durable records: one JSON line per start, exit and acknowledgement.

A start line only has to be written (in the page cache) before its job's command may
run: that survives a crash of the keeper or of gpusvd, and a power loss that takes the
line also takes the process it describes (recovery calls an attempt without a record
`interrupted`, which is then true). Exit and acknowledgement lines must be on disk
before anyone is told: every such line written in one turn of the keeper's loop reaches
the disk with one fdatasync, which carries the turn's start lines along. A line is
written whole or not at all (a failed write is cut off again); one cut short by a crash
mid-write is the last one and nothing depended on it, so it is skipped at replay. When
acknowledged records dominate the file, it is rewritten with only the live ones (write,
fsync, rename, fsync the directory).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

Key = tuple[int, int]  # (job id, attempt number)
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per line


@dataclass
class Record:
    """One attempt as the keeper knows it: started, and maybe ended."""

    job: int
    attempt: int
    pid: int
    start_ticks: int  # field 22 of /proc/PID/stat: a pid with the same value is the same process
    started_at: float
    cgroup: str | None = None  # the unified (v2) cgroup: membership and kill
    memcg: str | None = None  # the v1 memory cgroup, where v2 has no memory controller
    # Set once the leader was reaped (or, with `lost`, once a keeper found it orphaned):
    ended_at: float | None = None
    wait_status: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None  # the command could not be started: why
    lost: bool = False  # its keeper died while it ran: killed, true status unknown
    peak_bytes: int | None = None
    oom_kills: int | None = None
    leftovers: int = 0  # processes of the job still alive when its leader ended

    @property
    def key(self) -> Key:
        return (self.job, self.attempt)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))  # flat fields: asdict's deep copy costs more than a spawn


_FIELDS = {f.name for f in fields(Record)}


def record_from(entry: dict[str, Any]) -> Record:
    return Record(**{k: v for k, v in entry.items() if k in _FIELDS})


class Journal:
    """Append-only JSON lines in `path`; `records` is what replaying them gives."""

    def __init__(self, path: Path, *, compact_after: int = 2000) -> None:
        self.path = path
        self.compact_after = compact_after
        self.records: dict[Key, Record] = {}
        self.lines = 0
        self._replay()
        created = not path.exists()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        if created:
            fsync_dir(path.parent)
        self._size = os.fstat(self._fd).st_size
        self._dirty = False

    def _replay(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        if end < len(data):  # cut the torn tail, or the next line would be glued to it
            os.truncate(self.path, end)
        for raw in data[:end].split(b"\n"):
            try:
                entry = json.loads(raw)
                self._apply(entry)
            except (ValueError, TypeError, KeyError):
                continue  # a torn last line, never synced: nothing depended on it
            self.lines += 1

    def _apply(self, entry: dict[str, Any]) -> None:
        kind = entry["e"]
        key = (int(entry["job"]), int(entry["attempt"]))
        if kind in ("start", "rec"):
            self.records[key] = record_from(entry)
        elif kind in ("exit", "pid") and key in self.records:
            record = self.records[key]
            for name, value in entry.items():
                if name in _FIELDS and name not in ("job", "attempt"):
                    setattr(record, name, value)
        elif kind == "ack":
            self.records.pop(key, None)

    def append(self, kind: str, record: Record, **extra: Any) -> None:
        """Write one line now, whole, or raise OSError with the file as it was. A start,
        and the pid that follows a start recorded before its process existed, need no
        sync (module docstring); any other line is durable after sync()."""
        if kind == "start":
            self._write(_encode({"e": kind, **record.to_json()}).encode() + b"\n")
            self.records[record.key] = record  # what replay would build, without a copy
        else:
            entry = {"e": kind, "job": record.job, "attempt": record.attempt, **extra}
            self._write(_encode(entry).encode() + b"\n")
            self._apply(entry)
            self._dirty = self._dirty or kind != "pid"
        self.lines += 1

    def _write(self, line: bytes) -> None:
        try:
            done = os.write(self._fd, line)
            while done < len(line):  # a regular file may take less; the rest must follow
                done += os.write(self._fd, line[done:])
        except OSError:
            # A part of a line would glue the next one to it, and replay would lose both.
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(line)

    def sync(self) -> None:
        if self._dirty:
            os.fdatasync(self._fd)
            self._dirty = False
            if self.lines > self.compact_after and self.lines > 4 * len(self.records):
                self.compact()

    def compact(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            data = b"".join(
                _encode({"e": "rec", **record.to_json()}).encode() + b"\n"
                for record in self.records.values()
            )
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = len(data)
        self.lines = len(self.records)
        self._dirty = False

    def close(self) -> None:
        self.sync()
        os.close(self._fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
