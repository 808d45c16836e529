"""Sizes as users write them ("24G", "1.5G", "512M"), and the error that names a bad one.

Standard library only and cheap to import: the CLI parses --mem and --vram with it.
"""

from __future__ import annotations

_MIB = 1024**2
_UNITS = {"": 1, "K": 1024, "M": _MIB, "G": 1024**3, "T": 1024**4}
# A trailing "B" or "iB" is tolerated; the units are powers of 1024 whatever the spelling.
# `re` is imported and this compiled at the first parse (re caches it), not at import: the
# CLI imports this module for ConfigError alone.
_SIZE = r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT])(?:i?B)?|B)?"


class ConfigError(ValueError):
    """A bad key, type or value; the message is one line that names the key."""


def _fail(key: str, problem: str, value: object) -> ConfigError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return ConfigError(f"{key}: {problem}, got {shown}")


def parse_size(text: str | int, key: str = "size") -> int:
    """Bytes from "24G", "1.5G", "512M" or "512" (K/M/G/T are powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    import re

    match = re.fullmatch(_SIZE, text.strip(), re.IGNORECASE) if isinstance(text, str) else None
    if match is None:
        raise _fail(key, "must be a size >= 0 like '24G' (K, M, G, T: powers of 1024)", text)
    import math  # here, as fractions: `gpusv list` reaches this module, never this line
    from fractions import Fraction

    number, unit = match.group(1), (match.group(2) or "").upper()
    return math.ceil(Fraction(number) * _UNITS[unit])


def parse_size_mb(text: str | int, key: str = "size") -> int:
    """MiB from a size, rounded up."""
    return -(-parse_size(text, key) // _MIB)
