"""The config's scalar parsers: what each accepts, what it returns, and the one-line
error, naming the key, that it gives for everything else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.daemon.config import ConfigError
from supervisor.daemon.config_values import _bool, _int, _number, _path, _string


@pytest.mark.parametrize(
    ("minimum", "value", "expected"),
    [(0, 0, 0), (0, 7, 7), (1, 1, 1), (-3, -3, -3)],
)
def test_int_accepts_integers_at_or_above_the_minimum(
    minimum: int, value: int, expected: int
) -> None:
    assert _int(minimum)(value, "k") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "limits.max: must be an integer >= 1, got 0"),
        (True, "limits.max: must be an integer >= 1, got True"),
        (2.0, "limits.max: must be an integer >= 1, got 2.0"),
        ("3", "limits.max: must be an integer >= 1, got '3'"),
        (None, "limits.max: must be an integer >= 1, got None"),
    ],
)
def test_int_refuses_the_rest(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _int(1)(value, "limits.max")
    assert str(refused.value) == message


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), (0.5, 0.5), (3, 3.0), (1e9, 1e9)])
def test_number_is_a_float_at_or_above_the_minimum(value: float, expected: float) -> None:
    got = _number(0)(value, "k")
    assert got == expected and type(got) is float


@pytest.mark.parametrize("value", [-0.001, float("inf"), float("nan"), False, "1", None, [1]])
def test_number_refuses_the_rest(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^w\.t: must be a number >= 0, got "):
        _number(0)(value, "w.t")


def test_number_above_refuses_the_minimum_itself() -> None:
    assert _number(0, above=True)(0.001, "k") == 0.001
    with pytest.raises(ConfigError) as refused:
        _number(0, above=True)(0, "m.margin")
    assert str(refused.value) == "m.margin: must be a number > 0, got 0"
    with pytest.raises(ConfigError, match=r"must be a number >= 1.5, got 1.4"):
        _number(1.5)(1.4, "k")


def test_string_and_bool_take_only_their_own_type() -> None:
    assert _string("", "k") == "" and _string("x", "k") == "x"
    assert _bool(True, "k") is True and _bool(False, "k") is False
    with pytest.raises(ConfigError) as not_a_string:
        _string(5, "hooks.on_end")
    assert str(not_a_string.value) == "hooks.on_end: must be a string, got 5"
    with pytest.raises(ConfigError) as not_a_bool:
        _bool(1, "share")
    assert str(not_a_bool.value) == "share: must be true or false, got 1"
    with pytest.raises(ConfigError, match="must be true or false, got 'yes'"):
        _bool("yes", "share")


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigError) as refused:
        _string(list(range(40)), "k")
    shown = str(refused.value).removeprefix("k: must be a string, got ")
    assert len(shown) == 60 and shown.endswith("...") and shown.startswith("[0, 1, 2")


def test_a_path_is_made_absolute_when_read(tmp_path: Path) -> None:
    os.chdir(tmp_path)
    assert _path("state", "state_dir") == tmp_path / "state"
    assert _path("/var/lib/gpusv", "k") == Path("/var/lib/gpusv")
    assert _path(Path("a/b"), "k") == tmp_path / "a" / "b"
    os.environ["HOME"] = "/home/someone"
    assert _path("~/gpusv", "k") == Path("/home/someone/gpusv")


@pytest.mark.parametrize("value", ["", "   ", 3, None, True])
def test_a_path_must_be_a_non_empty_string(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^state_dir: must be a non-empty path, got "):
        _path(value, "state_dir")
