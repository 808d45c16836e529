"""The scalar value parsers of the config: each takes a TOML value and the key it came
from, and returns the value or raises ConfigError naming the key."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.wire.sizes import _fail

Parser = Callable[[object, str], Any]


def _int(minimum: int) -> Parser:
    def parse(value: object, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _fail(key, f"must be an integer >= {minimum}", value)
        return value

    return parse


def _number(minimum: float, *, above: bool = False) -> Parser:
    """A finite int or float >= minimum (> minimum when `above`)."""
    problem = f"must be a number {'>' if above else '>='} {minimum:g}"

    def parse(value: object, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(key, problem, value)
        number = float(value)
        if not math.isfinite(number) or number < minimum or (above and number == minimum):
            raise _fail(key, problem, value)
        return number

    return parse


def _string(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise _fail(key, "must be a string", value)
    return value


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, "must be true or false", value)
    return value


def _path(value: object, key: str) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise _fail(key, "must be a non-empty path", value)
    # Made absolute now so that a later chdir cannot change what it names.
    return Path(os.fspath(value)).expanduser().absolute()
