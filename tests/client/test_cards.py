"""How `gpus` and `top` print a card's health: a keeper that does not answer is said."""

from __future__ import annotations

from supervisor.client.cards import health_text


def test_a_card_whose_keeper_does_not_answer_says_so() -> None:
    assert health_text({"health": "ok", "keeper": "ok"}) == "ok"
    assert health_text({"health": "ok", "keeper": None}) == "ok"
    assert health_text({"health": "ok", "mig": True}) == "mig"
    silent = {"health": "ok", "keeper": "not answering"}
    assert health_text(silent) == "ok (keeper not answering)"
