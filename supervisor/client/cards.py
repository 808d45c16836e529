"""How `gpus` and `top` print a card's figures."""

from __future__ import annotations

from typing import Any


def util_text(pct: float | None) -> str:
    """ "37%", or "?" for a card that cannot report its load (not the same as 0 %)."""
    return "?" if pct is None else f"{pct:.0f}%"


def health_text(card: dict[str, Any]) -> str:
    text = "mig" if card.get("mig") and card["health"] == "ok" else str(card["health"])
    if card.get("keeper") == "not answering":  # the card takes no new job meanwhile
        text += " (keeper not answering)"
    return text


def allocation_notes(cards: list[dict[str, Any]]) -> list[str]:
    """One line when gpusvd manages only the cards its own environment grants it."""
    notes = {c["allocation"] for c in cards if c.get("allocation")}
    return [f"only the allocation's cards: {note}" for note in sorted(notes)]
