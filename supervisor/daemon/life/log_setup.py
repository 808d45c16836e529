"""Logging set-up: structlog for our own events, with stdlib `logging` bridged into it.

Console (`key=value`) or JSON lines, one line per event, flushed as it is written so that
a line logged right before `os._exit` is not lost. Under journald (our stream is the one
$JOURNAL_STREAM names, systemd.exec(5)) each event is a journal entry of its own, sent
over the native protocol with PRIORITY and GPUSV_* fields (journal.py); its MESSAGE is the
same line, without a timestamp of ours.

structlog is imported inside the functions: the CLI imports this module and should stay
quick to start.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from supervisor.daemon.life import journal

if TYPE_CHECKING:
    from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_BRIDGE_LEVEL = logging.WARNING
_bridge_handler: logging.Handler | None = None


def under_journald(stream: TextIO) -> bool:
    """True when `stream` is the journald stream that $JOURNAL_STREAM names."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        info = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return bool(expected) and expected == f"{info.st_dev}:{info.st_ino}"


class _WriteLoggerFactory:
    """structlog's WriteLogger (one whole line per write, under a lock, then a flush),
    remembering the name given to get_logger() so that `_add_name` can log it."""

    def __init__(self, stream: TextIO) -> None:
        import structlog

        self._make = structlog.WriteLogger
        self._stream = stream

    def __call__(self, *args: Any) -> Any:
        logger = self._make(self._stream)
        logger.name = str(args[0]) if args else ""  # type: ignore[attr-defined]
        return logger


def _add_name(logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
    name = getattr(logger, "name", "")
    if name:
        event.setdefault("logger", name)
    return event


def _renderer(fmt: Literal["console", "json"], stream: TextIO) -> Processor:
    import structlog

    if fmt == "json":
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(
        colors=stream.isatty(),
        exception_formatter=structlog.dev.plain_traceback,
    )


def _common(journald: bool) -> list[Processor]:
    import structlog

    chain: list[Processor] = [structlog.processors.add_log_level]
    if not journald:
        chain.append(structlog.processors.TimeStamper(fmt="iso", utc=True))
    return chain


def _install_bridge(
    stream: TextIO,
    fmt: Literal["console", "json"],
    renderer: Processor,
    sender: journal.Sender | None,
) -> None:
    """Route stdlib `logging` (aiosqlite, anyio, ...) through the same renderer, and
    under journald into the same journal."""
    import structlog

    global _bridge_handler
    root = logging.getLogger()
    if _bridge_handler is not None:
        root.removeHandler(_bridge_handler)
    pre: list[Processor] = [structlog.stdlib.add_logger_name, *_common(sender is not None)]
    if fmt == "json":
        pre.append(structlog.processors.format_exc_info)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=pre,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler: logging.Handler = (
        logging.StreamHandler(stream) if sender is None else journal.JournalHandler(sender)
    )
    handler.setFormatter(formatter)
    handler.setLevel(_BRIDGE_LEVEL)
    root.addHandler(handler)
    root.setLevel(_BRIDGE_LEVEL)
    _bridge_handler = handler


def configure(
    fmt: Literal["console", "json"] = "console",
    level: str = "info",
    stream: TextIO | None = None,
    journal_socket: Path = journal.SOCKET,
) -> None:
    """Set up logging for the process; calling it again replaces the previous set-up.
    Under journald, entries go to `journal_socket` (lines on `stream` when it refuses)."""
    import structlog

    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    stream = sys.stderr if stream is None else stream
    sender = journal.Sender(journal_socket, stream) if under_journald(stream) else None
    renderer = _renderer(fmt, stream)
    chain: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        _add_name,
        *_common(sender is not None),
    ]
    if fmt == "json":
        chain.append(structlog.processors.format_exc_info)
    factory: Any = _WriteLoggerFactory(stream)
    if sender is not None:
        chain.append(journal.to_entry(renderer))
        factory = journal.JournalLoggerFactory(sender)
    else:
        chain.append(renderer)
    structlog.configure(
        processors=chain,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=factory,
        # Loggers made before a reconfigure (module-level ones) must follow it.
        cache_logger_on_first_use=False,
    )
    _install_bridge(stream, fmt, renderer, sender)


def get_logger(name: str | None = None) -> FilteringBoundLogger:
    """A logger whose lines carry `logger=name` when a name is given."""
    import structlog

    logger: FilteringBoundLogger = structlog.get_logger(*(() if name is None else (name,)))
    return logger
