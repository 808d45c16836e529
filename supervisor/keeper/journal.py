"""The keeper's durable records: one JSON line per start, exit and acknowledgement.

Appends are grouped: every line written in one turn of the keeper's loop reaches the
disk with one fdatasync, and nothing that depends on a line (a job's command running, an
exit reported) happens before that. A line cut short by a crash is the last one and was
never synced, so it is skipped at replay. When acknowledged records dominate the file,
it is rewritten with only the live ones (write, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

Key = tuple[int, int]  # (job id, attempt number)


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
        elif kind == "exit" and key in self.records:
            record = self.records[key]
            for name, value in entry.items():
                if name in _FIELDS and name not in ("job", "attempt"):
                    setattr(record, name, value)
        elif kind == "ack":
            self.records.pop(key, None)

    def append(self, kind: str, record: Record, **extra: Any) -> None:
        """Write one line now; it is durable after the next sync()."""
        entry: dict[str, Any] = {"e": kind, "job": record.job, "attempt": record.attempt}
        entry.update(record.to_json() if kind in ("start", "rec") else extra)
        self._apply(entry)
        os.write(self._fd, json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        self.lines += 1
        self._dirty = True

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
            for record in self.records.values():
                entry = {"e": "rec", **record.to_json()}
                os.write(fd, json.dumps(entry, separators=(",", ":")).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.lines = len(self.records)

    def close(self) -> None:
        self.sync()
        os.close(self._fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
