"""Durations as users write them ("90", "90s", "15m", "2h", "1d"), and back to words.

Standard library only and cheap to import: the CLI parses --time, --timeout and
--older-than with it, the daemon its duration keys.
"""

from __future__ import annotations

from supervisor.wire.sizes import ConfigError, _fail

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# `re` is imported and this compiled at the first parse (re caches it), not at import:
# `gpusv list` only prints ages, and `re` with its `enum` is about 5 ms of a CLI start.
_DURATION = r"(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)"
MAX_DURATION_S = 10 * 365 * 86400


def parse_duration(text: str | float, key: str = "duration") -> float:
    """Seconds from "90", "90s", "15m", "2h" or "1d" (or a plain number of seconds)."""
    import math  # here, as re: `gpusv list` imports this module for duration_text alone

    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        import re

        match = (
            re.fullmatch(_DURATION, text.strip(), re.IGNORECASE) if isinstance(text, str) else None
        )
        if match is None:
            raise _fail(key, "must be a duration like 90, 90s, 15m, 2h or 1d", text)
        seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:
        raise _fail(key, "must be a duration between 0 and 10 years", text)
    return seconds


def duration_text(seconds: float) -> str:
    """Short words for a duration: 45s, 12m, 3h05m, 2d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


__all__ = ["ConfigError", "duration_text", "parse_duration"]
