"""supervisor.wire.jsonline gives what `json` gives: the same text for every value the
protocol sends, the same values and the same errors for every line it reads."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.wire import framing, jsonline

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and the infinities too: json writes them as NaN, Infinity
    | st.text()  # lone surrogates included
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
        | st.dictionaries(
            st.integers() | st.booleans() | st.none() | st.floats(), inner, max_size=3
        )
    ),
    max_leaves=20,
)


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def same(a: Any, b: Any) -> bool:
    """Equal, NaN included (json's text of both is the same, key order too)."""
    return dumps(a) == dumps(b) and type(a) is type(b)


@settings(max_examples=150)
@given(VALUES)
def test_encode_writes_what_json_writes(obj: object) -> None:
    assert jsonline.encode(obj) == dumps(obj)


@settings(max_examples=150)
@given(VALUES)
def test_dumps_writes_what_json_dumps_writes(obj: object) -> None:
    """The text stored in SQLite is json.dumps's own, byte for byte, raising what it
    raises for a value JSON has no text for."""
    assert jsonline.dumps(obj) == json.dumps(obj)


def test_dumps_refuses_what_json_dumps_refuses() -> None:
    for bad in ({1, 2}, {"a": object()}, [b"x"]):
        with pytest.raises(TypeError) as ours:
            jsonline.dumps(bad)
        with pytest.raises(TypeError) as theirs:
            json.dumps(bad)
        assert str(ours.value) == str(theirs.value)
    assert jsonline.dumps({"after": "a refusal"}) == json.dumps({"after": "a refusal"})


@settings(max_examples=150)
@given(VALUES, st.sampled_from(["", " ", "\n", " \t\r\n"]))
def test_decode_reads_back_what_json_reads(obj: object, space: str) -> None:
    text = space + dumps(obj) + space
    assert same(jsonline.decode(text), json.loads(text))
    line = text.encode("utf-8", "surrogatepass")
    assert same(jsonline.decode(line), json.loads(line))


TEXT = st.text(alphabet='{}[]",:0123456789.eE+-tfnulrsaINfiy \t\n\r\\x\x00\u00e9', max_size=30)


@settings(max_examples=400)
@given(TEXT)
def test_decode_accepts_and_refuses_what_json_does(text: str) -> None:
    """Any text: the same value, or a JSONDecodeError with the same message and place."""
    try:
        expected = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as got:
            jsonline.decode(text)
        assert (got.value.msg, got.value.pos) == (exc.msg, exc.pos)
    else:
        assert same(jsonline.decode(text), expected)


@pytest.mark.parametrize("text", ["", " ", "{}x", "[1] [2]", "{'a':1}", "[1,]", '"\x01"', "nul"])
def test_the_errors_are_jsons(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as exc:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        jsonline.decode(text)
    assert str(got.value) == str(exc.value)


def test_what_json_cannot_write_fails_as_it_does_and_leaves_nothing_behind() -> None:
    bad = {"a": [1, {2}]}
    with pytest.raises(TypeError) as exc:
        dumps(bad)
    with pytest.raises(TypeError) as got:
        jsonline.encode(bad)
    assert str(got.value) == str(exc.value) == "Object of type set is not JSON serializable"
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        jsonline.encode(loop)
    # A failed encode leaves no mark on the next: the same list again, no longer circular.
    loop.clear()
    assert jsonline.encode([loop, loop]) == "[[],[]]"


def test_the_constants_and_framing() -> None:
    assert math.isnan(jsonline.decode("NaN"))
    assert jsonline.decode(b"[Infinity,-Infinity]") == [math.inf, -math.inf]
    assert framing.encode({"argv": ["caf\u00e9", "\udc80"]}) == (
        b'{"argv":["caf\xc3\xa9","\\udc80"]}\n'
    )
