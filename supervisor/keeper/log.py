"""The keeper's own log: its stderr, a file in its directory. A log line is worth less
than any job: a write that fails (a full disk, a closed descriptor) is counted and
dropped, never raised, and the count is said with the next line that goes through."""

from __future__ import annotations

import os
import time

_dropped = 0


def log_line(message: str) -> None:
    global _dropped
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    lost = f" ({_dropped} earlier log lines dropped)" if _dropped else ""
    data = f"{stamp} keeper[{os.getpid()}]: {message}{lost}\n".encode(errors="replace")
    try:
        done = os.write(2, data)
        while done < len(data):
            done += os.write(2, data[done:])
    except (OSError, ValueError):
        _dropped += 1
        return
    _dropped = 0


def dropped() -> int:
    """Log lines dropped since the last one written."""
    return _dropped
