"""Log entries with fields of our own, sent to journald over its native protocol.

Under journald (log_setup decides) each event becomes one journal entry: MESSAGE is the
line the console or JSON format would have written, PRIORITY its level, and the event's
keys that name a job, an attempt, a card, a reason or an event kind become GPUSV_*
fields, so that `journalctl -u gpusvd GPUSV_JOB=42` selects one job's story. Three kinds
of entry carry a MESSAGE_ID, fixed for ever like systemd's catalog ids, so that
`journalctl MESSAGE_ID=...` finds every one of them: the deadman's exit, a GPU hang, an
OOM kill.

The protocol itself (field encoding, values with newlines, an entry too big for one
datagram passed as a sealed memfd as sd_journal_sendv does) is logging-journald's
`JournaldTransport`: a pure-Python module of MIT licence with no dependencies, so the
daemon installs with pip alone. systemd's own bindings (systemd-python) are built from
source against libsystemd's headers with a C compiler, which a fresh machine lacks. The
socket is addressed on every send, never connected once, so a restart of journald does
not leave the daemon holding a dead socket. An entry that cannot be sent (no journald at
that path, a full queue refused) is written to the stream as a line with its `<N>`
priority prefix, which journald files at that level: nothing is lost for a field.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from structlog.typing import EventDict, WrappedLogger

SOCKET = Path("/run/systemd/journal/socket")
IDENTIFIER = "gpusvd"  # SYSLOG_IDENTIFIER: what `journalctl -t gpusvd` selects

# 128-bit ids, made once (uuid4) and never to change: operators' queries and alerts name them.
DEADMAN_EXIT = "13f0368a14c2483d80583ee63f982d8d"
GPU_HANG = "a5e2f280df924ab0aba9f4bd6118a8a1"
OOM_KILLED = "a5b60b5d478045c2b4653c3cf846175d"

# The event dicts' keys, as the daemon logs them, and the journal field each fills. A list
# value (the cards of a multi-GPU attempt) gives the field once per item, which journald
# keeps as one field with several values: GPUSV_CARD=1 matches an attempt on cards 0,1.
FIELDS: Mapping[str, str] = {
    "job_id": "GPUSV_JOB",
    "attempt": "GPUSV_ATTEMPT",
    "gpu": "GPUSV_CARD",
    "gpus": "GPUSV_CARD",
    "gpu_uuid": "GPUSV_GPU_UUID",
    "gpu_uuids": "GPUSV_GPU_UUID",
    "reason": "GPUSV_REASON",
    "event_kind": "GPUSV_EVENT",
}

# sd-daemon(3) priorities by structlog method; "exception" is what log.exception() is.
PRIORITIES: Mapping[str, int] = {
    "debug": 7,
    "info": 6,
    "warning": 4,
    "warn": 4,
    "error": 3,
    "exception": 3,
    "critical": 2,
    "fatal": 2,
}
_STDLIB_PRIORITIES = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}


def message_id(event: Mapping[str, Any]) -> str | None:
    """The catalog id of the three kinds of entry an operator looks for, else None."""
    kind = event.get("event_kind")
    if kind == "deadman_exit":
        return DEADMAN_EXIT
    if kind == "gpu_hang":
        return GPU_HANG
    if kind == "exited" and event.get("reason") == "oom_killed":
        return OOM_KILLED
    return None


def _values(value: Any) -> Iterator[Any]:
    items = value if isinstance(value, list | tuple | set | frozenset) else (value,)
    for item in items:
        if item is not None and item != "":
            yield item


def fields(event: Mapping[str, Any], priority: int, message: str) -> list[tuple[str, Any]]:
    """The journal entry of one event, as (field, value) pairs in sending order."""
    pairs: list[tuple[str, Any]] = [
        ("MESSAGE", message),
        ("PRIORITY", priority),
        ("SYSLOG_IDENTIFIER", IDENTIFIER),
    ]
    mid = message_id(event)
    if mid is not None:
        pairs.append(("MESSAGE_ID", mid))
    for key, field in FIELDS.items():
        if key in event:
            pairs.extend((field, str(v)) for v in _values(event[key]))
    logger = event.get("logger")
    if logger:
        pairs.append(("GPUSV_LOGGER", str(logger)))
    return pairs


class Sender:
    """Sends entries to the journal socket; one that cannot be sent becomes a prefixed
    line on `fallback` (whole, under a lock, flushed: the deadman exits right after)."""

    def __init__(self, socket_path: Path, fallback: TextIO) -> None:
        from logging_journald import JournaldTransport

        self._transport = JournaldTransport(socket_path, connected=False)
        self._fallback = fallback
        self._lock = threading.Lock()

    def send(self, pairs: list[tuple[str, Any]]) -> None:
        try:
            self._transport.send(pairs)
        except OSError:
            self._write_line(pairs)

    def _write_line(self, pairs: list[tuple[str, Any]]) -> None:
        found = dict(pairs)
        prefix = f"<{found.get('PRIORITY', 6)}>"
        text = "\n".join(prefix + part for part in str(found.get("MESSAGE", "")).split("\n"))
        with self._lock:
            self._fallback.write(text + "\n")
            self._fallback.flush()


class JournalLogger:
    """structlog's logger under journald: every method sends the entry it is given."""

    def __init__(self, sender: Sender, name: str = "") -> None:
        self._sender = sender
        self.name = name

    def send(self, *, entry: list[tuple[str, Any]]) -> None:
        self._sender.send(entry)

    debug = info = warning = warn = error = exception = critical = fatal = msg = log = send


class JournalLoggerFactory:
    """Makes a JournalLogger per get_logger(), remembering its name (log_setup adds it)."""

    def __init__(self, sender: Sender) -> None:
        self.sender = sender

    def __call__(self, *args: Any) -> JournalLogger:
        return JournalLogger(self.sender, str(args[0]) if args else "")


def to_entry(render: Callable[[WrappedLogger, str, EventDict], Any]) -> Any:
    """The last processor of the chain: the event's fields (read before `render`, which
    consumes the dict), then MESSAGE as `render` writes the line."""

    def processor(logger: WrappedLogger, method: str, event: EventDict) -> dict[str, Any]:
        priority = PRIORITIES.get(method, 6)
        kept = dict(event)
        message = str(render(logger, method, event))
        return {"entry": fields(kept, priority, message)}

    return processor


class JournalHandler(logging.Handler):
    """The stdlib bridge under journald: a record's formatted line, at its priority."""

    def __init__(self, sender: Sender) -> None:
        super().__init__()
        self.sender = sender

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            priority = _STDLIB_PRIORITIES.get(record.levelname, 6)
            self.sender.send(fields({"logger": record.name}, priority, message))
        except Exception:
            self.handleError(record)
