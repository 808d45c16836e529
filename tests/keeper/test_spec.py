"""A spawn's argv and environment are strings without NUL, or the spawn is refused with
nothing done (checked at every spawn, so in one pass over each)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.keeper.spawn import BadRequest, parse_spec

GOOD: dict[str, Any] = {
    "job": 1,
    "attempt": 1,
    "argv": ["true", "é"],
    "cwd": "/",
    "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "EMPTY": ""},
    "stdout": "/tmp/1.out",
    "stderr": "/tmp/1.out",
}


def test_strings_without_nul_are_taken_as_they_are() -> None:
    spec = parse_spec(GOOD)
    assert spec.argv == ("true", "é") and spec.env == GOOD["env"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("argv", []),
        ("argv", ["true", 1]),
        ("argv", ["tr\0ue"]),
        ("argv", [None]),
        ("argv", "true"),
        ("env", {"A": 1}),
        ("env", {"A": None}),
        ("env", {"A\0B": "x"}),
        ("env", {"A": "x\0y"}),
        ("env", {"A": ["x"]}),
        ("env", ["A=x"]),
    ],
)
def test_anything_else_is_refused(field: str, value: object) -> None:
    with pytest.raises(BadRequest, match=field):
        parse_spec({**GOOD, field: value})
