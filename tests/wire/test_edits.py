"""The wire's side of pinning and `update`: card lists and the update request."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.client.submitting import parse_cards
from supervisor.wire import protocol
from supervisor.wire.edits import Update
from supervisor.wire.protocol import ProtocolError, Submit
from supervisor.wire.sizes import ConfigError


def submit(**fields: Any) -> dict[str, Any]:
    return {"type": "submit", "argv": ["x"], "cwd": "/", **fields}


def test_cards_are_sorted_and_kept() -> None:
    req = protocol.parse_request(submit(cards=[3, 1], not_cards=[2]))
    assert isinstance(req, Submit)
    assert (req.options.cards, req.options.not_cards) == ((1, 3), (2,))
    req = protocol.parse_request(submit())
    assert isinstance(req, Submit) and req.options.cards is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cards": []}, "at least one card"),
        ({"cards": [1, 1]}, "appears twice"),
        ({"cards": [-1]}, "from 0 to 63"),
        ({"cards": [True]}, "from 0 to 63"),
        ({"not_cards": "0"}, "must be a list"),
    ],
)
def test_bad_card_lists_are_bad_request(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ProtocolError, match=words) as caught:
        protocol.parse_request(submit(**fields))
    assert caught.value.code == protocol.BAD_REQUEST


def test_update_parses() -> None:
    req = protocol.parse_request({"type": "update", "ids": [4, 5], "priority": 3})
    assert req == Update((4, 5), priority=3)
    req = protocol.parse_request({"type": "update", "ids": [4], "cards": [], "time_limit_s": 60})
    assert req == Update((4,), time_limit_s=60.0, cards=())


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "update", "ids": [1]},  # nothing to change
        {"type": "update", "priority": 1},  # no ids
        {"type": "update", "ids": [1], "time_limit_s": 0},
        {"type": "update", "ids": [1], "gpus": 2},  # not something update changes
    ],
)
def test_bad_updates_are_bad_request(obj: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_request(obj)
    assert caught.value.code == protocol.BAD_REQUEST


def test_the_client_reads_card_lists_as_ranges() -> None:
    assert parse_cards("0,2-3", "--cards") == [0, 2, 3]
    assert parse_cards("3,1,1", "--cards") == [1, 3]
    assert parse_cards(None, "--cards") is None
    for bad in ("", "a", "3-1", "1-", "-1"):
        with pytest.raises(ConfigError, match="--cards"):
            parse_cards(bad, "--cards")
