"""Typed fields out of a request object: each bad one a ProtocolError that names it."""

from __future__ import annotations

from typing import Any

from supervisor.wire.errors import BAD_REQUEST, ProtocolError

MAX_ID = 2**63 - 1


class _Fields:
    """Reads typed fields out of a request object and rejects anything left over."""

    def __init__(self, obj: dict[str, Any], where: str = "") -> None:
        self.obj = obj
        self.seen: set[str] = {"type", "version"} if not where else set()
        self.where = where

    def _name(self, key: str) -> str:
        return f"{self.where}{key}"

    def _get(self, key: str) -> Any:
        self.seen.add(key)
        return self.obj.get(key)

    def fail(self, key: str, why: str) -> ProtocolError:
        return ProtocolError(BAD_REQUEST, f"field '{self._name(key)}': {why}")

    def int_(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        return value

    def req_int(self, key: str, lo: int, hi: int) -> int:
        value = self.int_(key, None, lo, hi)
        if value is None:
            raise self.fail(key, "is required")
        return value

    def float_(self, key: str, lo: float, hi: float) -> float | None:
        value = self._get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        return float(value)

    def bool_(self, key: str) -> bool:
        value = self._get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(key, "must be true or false")
        return value

    def str_(self, key: str, default: str | None, max_len: int) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {type(value).__name__}")
        if len(value) > max_len:
            raise self.fail(key, f"longer than {max_len} characters")
        if "\x00" in value:
            raise self.fail(key, "contains a NUL character")
        return value

    def str_list(self, key: str, max_items: int, max_len: int) -> list[str] | None:
        value = self._get(key)
        if value is None:
            return None
        return _str_list(value, self._name(key), max_items, max_len)

    def str_map(self, key: str, max_items: int, max_key: int, max_value: int) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, "must be an object of strings")
        if len(value) > max_items:
            raise self.fail(key, f"more than {max_items} entries")
        for k, v in value.items():
            if not isinstance(v, str) or len(k) > max_key or len(v) > max_value:
                raise self.fail(key, f"entry '{k[:40]}' must be a string of at most {max_value}")
            if "\x00" in k or "\x00" in v:
                raise self.fail(key, f"entry '{k[:40]}' contains a NUL character")
        return dict(value)

    def int_list(self, key: str, max_items: int) -> list[int]:
        value = self._get(key)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise self.fail(key, f"must be a list of at most {max_items} ids")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= MAX_ID:
                raise self.fail(key, "ids are positive integers that fit 63 bits")
        return list(value)

    def card_list(self, key: str, max_card: int) -> tuple[int, ...] | None:
        """Card indices (sorted, each once), or None when absent."""
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > max_card + 1:
            raise self.fail(key, f"must be a list of at most {max_card + 1} card indices")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= max_card:
                raise self.fail(key, f"card indices are integers from 0 to {max_card}")
        if len(set(value)) != len(value):
            raise self.fail(key, "a card appears twice")
        return tuple(sorted(value))

    def done(self) -> None:
        extra = sorted(set(self.obj) - self.seen)
        if extra:
            raise ProtocolError(BAD_REQUEST, f"unknown field '{self._name(extra[0])}'")


def _str_list(value: Any, name: str, max_items: int, max_len: int) -> list[str]:
    if not isinstance(value, list):
        raise ProtocolError(BAD_REQUEST, f"field '{name}': must be a list of strings")
    if len(value) > max_items:
        raise ProtocolError(BAD_REQUEST, f"field '{name}': more than {max_items} items")
    for item in value:
        if not isinstance(item, str):
            raise ProtocolError(BAD_REQUEST, f"field '{name}': items must be strings")
        if len(item) > max_len or "\x00" in item:
            raise ProtocolError(BAD_REQUEST, f"field '{name}': item too long or has NUL")
    return list(value)
