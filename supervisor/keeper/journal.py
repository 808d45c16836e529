"""The keeper's durable records: one line per start, exit and acknowledgement.

A start line only has to be written (in the page cache) before its job's command may
run: that survives a crash of the keeper or of gpusvd, and a power loss that takes the
line also takes the process it describes (recovery calls an attempt without a record
`interrupted`, which is then true). An exit line is told to gpusvd once it is written:
gpusvd commits it (SQLite, synced) before it acts on it or tells anyone, and acknowledges
it then. Until that ack the exit must not be lost to a power cut for longer than it
takes gpusvd to commit: an exit left unacknowledged for `grace` seconds, or one written
while no gpusvd is attached, is made durable with one fdatasync (sync_due), which
carries the turn's other lines along. What a power cut takes before that is an exit
nobody was told of: the attempt ends `interrupted`, as one the cut stopped. An
acknowledgement needs no sync of its own either: an ack that a power loss takes leaves an
ended record that the next gpusvd finds committed already and acknowledges again (as
after a gpusvd that died between its commit and its ack).

Each line is `#<length> <crc32> <json>`: replay tells a torn last line (a crash
mid-write, nothing depended on it: cut quietly) from damage in the middle (a line whose
length or checksum is wrong: reported, kept count of, and the record it belongs to
flagged `damaged`, never silently taken for one that never ended). Lines of the older
format (bare JSON) are read as before, so a journal from before an upgrade replays.

A line is written whole or not at all (a failed write is cut off again). An exit or an
acknowledgement that cannot be written (a full disk) is kept in memory, in order, and
written again at each sync until it goes through; a start that cannot be written is
refused (its job never runs). When acknowledged records dominate the file, it is
rewritten with only the live ones (write, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from supervisor.wire import jsonline

Key = tuple[int, int]  # (job id, attempt number)
# The wire's own encoding (supervisor.wire.framing): compact, UTF-8 as it is; the C
# codec called directly, without json.JSONEncoder's Python layers (4 lines a job).
_encode = jsonline.encode
_HEADER = re.compile(rb"#(\d{1,9}) ([0-9a-f]{8}) ")
_KEY = re.compile(rb'"job":(\d+),"attempt":(\d+)')


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
    output_dropped: int = 0  # bytes of its output the disk refused, by its exit (output.py)
    damaged: bool = False  # a journal line of it could not be read at replay

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


def frame(entry: dict[str, Any]) -> bytes:
    """One journal line: its length and checksum, then the JSON."""
    body = _encode(entry).encode("utf-8", "backslashreplace")
    return b"#%d %08x " % (len(body), zlib.crc32(body)) + body + b"\n"


def unframe(raw: bytes) -> dict[str, Any]:
    """A line's entry; ValueError when it is not whole or not what was written."""
    if raw.startswith(b"{"):  # the format before checksums
        entry = json.loads(raw)
    else:
        head = _HEADER.match(raw)
        if head is None:
            raise ValueError("no header")
        body = raw[head.end() :]
        if len(body) != int(head[1]) or zlib.crc32(body) != int(head[2], 16):
            raise ValueError("length or checksum does not match")
        entry = json.loads(body)
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    return entry


class Journal:
    """Append-only lines in `path`; `records` is what replaying them gives."""

    def __init__(
        self,
        path: Path,
        *,
        compact_after: int = 2000,
        log: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.path = path
        self.compact_after = compact_after
        self.log = log
        self.records: dict[Key, Record] = {}
        self.lines = 0
        self.damaged: list[str] = []  # what replay could not read, said at each attach
        self.pending: list[bytes] = []  # lines written to memory only: the disk refused
        # Exits written since the last fdatasync that gpusvd has not acknowledged: when each
        # was written (monotonic). An ack means gpusvd committed it: it needs no sync.
        self.unsynced: dict[Key, float] = {}
        self._replay()
        created = not path.exists()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        if created:
            fsync_dir(path.parent)
        self._size = os.fstat(self._fd).st_size
        self._cut = False  # a failed write could not be cut off: start the next line anew

    def _replay(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        if end < len(data):  # cut the torn tail, or the next line would be glued to it
            self.log(f"journal: a torn last line ({len(data) - end} bytes) cut off")
            os.truncate(self.path, end)
        raws = data[:end].split(b"\n")[:-1]
        for n, raw in enumerate(raws, 1):
            try:
                self._apply(unframe(raw))
            except (ValueError, TypeError, KeyError) as exc:
                if n == len(raws) and raw.strip(b"\0 ") == b"":
                    continue  # a last line of zeros: a crash left the length, not the data
                self._damage(n, raw, exc)
                continue
            self.lines += 1

    def _damage(self, n: int, raw: bytes, exc: Exception) -> None:
        """A line in the middle that cannot be read: said loudly, and the record it seems
        to belong to (or, when it names none, every record not ended yet) is flagged, so
        that an exit it held is never taken silently for a job that never ended."""
        found = _KEY.search(raw)
        key = (int(found[1]), int(found[2])) if found else None
        what = f"line {n} ({len(raw)} bytes, job {key or 'unknown'}): {exc}"
        self.damaged.append(what)
        self.log(f"journal DAMAGED: {what}")
        for record in self.records.values():
            if (key is None and not record.ended) or record.key == key:
                record.damaged = True

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
            self.unsynced.pop(key, None)

    def append(self, kind: str, record: Record, **extra: Any) -> None:
        """Write one line now, whole. A start, the pid that follows a start recorded
        before its process existed, and an ack need no sync (module docstring); an exit
        is durable after sync(), which sync_due asks for. A start the file refuses raises
        OSError with the file as it was; any other line is then kept in memory (`pending`)
        and written at a sync."""
        if kind == "start":
            if self.pending:  # lines must stay in order, and these wait for the disk
                self.flush()
            self._write(frame({"e": kind, **record.to_json()}))
            self.records[record.key] = record  # what replay would build, without a copy
        else:
            entry = {"e": kind, "job": record.job, "attempt": record.attempt, **extra}
            line = frame(entry)
            self._apply(entry)  # in memory whatever the disk says: never lost here
            if kind == "exit":
                self.unsynced.setdefault(record.key, time.monotonic())
            if self.pending:
                self.pending.append(line)
            else:
                try:
                    self._write(line)
                except OSError as exc:
                    self.pending.append(line)
                    self.log(f"journal: {kind} of job {record.job} kept in memory: {exc}")
        self.lines += 1

    def flush(self) -> None:
        """Write what waits in memory, in order; OSError while the disk still refuses."""
        while self.pending:
            self._write(self.pending[0])
            self.pending.pop(0)

    def _write(self, line: bytes) -> None:
        if self._cut:  # a part of a line is left on file: this one must not join it
            try:
                os.ftruncate(self._fd, self._size)
                self._cut = False
            except OSError:
                line = b"\n" + line  # the part stands alone, read as damage, not glued
        try:
            done = os.write(self._fd, line)
            while done < len(line):  # a regular file may take less; the rest must follow
                done += os.write(self._fd, line[done:])
        except OSError:
            # A part of a line would glue the next one to it, and replay would lose both.
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._cut = True
            raise
        self._size += len(line)
        if line.startswith(b"\n"):
            self._size = os.fstat(self._fd).st_size
            self._cut = False

    @property
    def durable(self) -> bool:
        """Whether every line is in the file (none waits in memory for the disk)."""
        return not self.pending

    def sync_due(self, now: float, grace: float | None) -> bool:
        """Whether this turn must end with a sync: lines wait in memory for the disk, or
        an exit has gone unacknowledged for `grace` seconds (None: no gpusvd will commit
        it, so at once)."""
        if self.pending:
            return True
        if not self.unsynced:
            return False
        return grace is None or now - min(self.unsynced.values()) >= grace

    def sync_deadline(self, grace: float) -> float | None:
        """When the oldest unacknowledged exit falls due for a sync (monotonic)."""
        return min(self.unsynced.values()) + grace if self.unsynced else None

    def sync(self) -> bool:
        """Everything written so far on disk; False (logged) while the disk refuses: the
        lines wait in memory and the next sync tries again."""
        if not self.unsynced and not self.pending:
            self.compact_if_worth()
            return True
        try:
            self.flush()
            os.fdatasync(self._fd)
        except OSError as exc:
            self.log(f"journal: cannot sync ({len(self.pending)} lines wait in memory): {exc}")
            return False
        self.unsynced.clear()
        self.compact_if_worth()
        return True

    def write_out(self) -> bool:
        """What waits in memory written to the file, not synced; False (logged) while the
        disk refuses."""
        try:
            self.flush()
        except OSError as exc:
            self.log(f"journal: cannot write ({len(self.pending)} lines wait in memory): {exc}")
            return False
        self.compact_if_worth()
        return True

    def compact_if_worth(self) -> None:
        if self.lines > self.compact_after and self.lines > 4 * len(self.records):
            self.compact()

    def compact(self) -> bool:
        """Rewrite the file with the live records only; False (logged, the old file kept
        whole) when that cannot be done now."""
        if self.pending:
            return False
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(frame({"e": "rec", **r.to_json()}) for r in self.records.values())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                done = 0
                while done < len(data):
                    done += os.write(fd, data[done:])
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
        except OSError as exc:
            self.log(f"journal: cannot compact, kept as it is: {exc}")
            tmp.unlink(missing_ok=True)
            return False
        new = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.close(self._fd)
        self._fd = new
        try:
            fsync_dir(self.path.parent)
        except OSError as exc:
            self.log(f"journal: compacted, its directory not synced: {exc}")
        self._size = len(data)
        self._cut = False
        self.lines = len(self.records)
        self.unsynced.clear()  # the new file was synced whole
        return True

    def close(self) -> None:
        self.sync()
        os.close(self._fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
