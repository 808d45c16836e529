"""An answer whose list is sent in pieces is the same line as the whole answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from supervisor.daemon.requests.server import Pieces, frames
from supervisor.wire import protocol


def _pieces(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@pytest.mark.parametrize("size", [1, 2, 3, 1000])
@pytest.mark.parametrize("count", [0, 1, 5, 7])
def test_a_list_in_pieces_is_the_whole_answers_line(size: int, count: int) -> None:
    items = [{"id": None, "argv": ["é", "a\udcff"], "n": i} for i in range(count)]
    whole = {"ok": True, "jobs": items, "warnings": ["x"], "after": {"k": [1]}}
    streamed = {"ok": True, "jobs": Pieces(_pieces(items, size)), "warnings": ["x"]}
    streamed["after"] = {"k": [1]}
    line = b"".join(frames(streamed))
    assert line == protocol.encode(whole)
    assert json.loads(line)["jobs"] == json.loads(protocol.encode(whole))["jobs"]


def test_a_list_first_or_alone_and_empty_pieces() -> None:
    obj = {"jobs": Pieces(iter([[], [1], [], [2, 3], []]))}
    assert b"".join(frames(obj)) == protocol.encode({"jobs": [1, 2, 3]})


def test_an_answer_without_pieces_is_one_frame() -> None:
    obj = {"ok": True, "ids": [1, 2]}
    assert list(frames(obj)) == [protocol.encode(obj)]
