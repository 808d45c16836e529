"""Jobs pinned to cards (`--cards`, `--not-cards`): which cards a job may use, whether
that can ever be enough, and the words for a job that waits for its own cards.

A pinned job carries the cards it may use (`JobSpec.cards`, sorted); `None` means any
card. `--not-cards` is resolved at submit against the machine's cards, so the daemon
keeps one list. Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def resolve(
    cards: Sequence[int] | None, not_cards: Sequence[int] | None, known: Collection[int]
) -> tuple[int, ...] | None:
    """The cards a job may use, from `--cards` and `--not-cards` on a machine with the
    `known` card indices: None when neither flag was given. Raises ValueError naming the
    card that is not there, or saying that nothing is left."""
    if cards is None and not not_cards:
        return None
    for flag, given in (("--cards", cards), ("--not-cards", not_cards)):
        for index in given or ():
            if index not in known:
                raise ValueError(f"{flag}: no card {index}; {machine_cards(known)}")
    base = set(known) if cards is None else set(cards)
    allowed = tuple(sorted(base - set(not_cards or ())))
    if not allowed:
        raise ValueError("--cards/--not-cards leave no card to run on")
    return allowed


def refusal(gpus: int, cards: Sequence[int] | None) -> str | None:
    """Why a job asking for `gpus` cards can never run on `cards`, or None."""
    if cards is None:
        return None
    if gpus <= 0:
        return "--cards/--not-cards apply to GPU jobs; this job asks for --gpus 0"
    if len(cards) < gpus:
        return f"asks for {gpus} GPUs but may use only {len(cards)} ({card_text(cards)})"
    return None


def allowed(free: Mapping[int, int], cards: Collection[int] | None) -> Mapping[int, int]:
    """Of `free` (card index -> free VRAM), the cards a job pinned to `cards` may take."""
    if cards is None:
        return free
    return {i: v for i, v in free.items() if i in cards}


def place(
    idle: Mapping[int, int], gpus: int, need_mb: int, cards: Sequence[int], need_text: str
) -> tuple[int, ...] | str:
    """The cards a pinned whole-card job gets of the `idle` ones (index -> free VRAM),
    best fit as for any job, or its `waiting_for` when too few of its own are free."""
    mine = allowed(idle, cards)
    fitting = sorted((free, i) for i, free in mine.items() if free >= need_mb)
    if len(fitting) >= gpus:
        return tuple(sorted(i for _, i in fitting[:gpus]))
    where = f"waiting for its cards ({card_text(cards)}): needs"
    if len(mine) < gpus:  # too few idle, whatever their VRAM
        noun = "GPU" if gpus == 1 else "GPUs"
        return f"{where} {gpus} free {noun}, {len(mine)} free"
    return f"{where} {need_text} of VRAM on {gpus}, {len(fitting)} have it"


def card_text(cards: Sequence[int]) -> str:
    """ "card 2", "cards 0, 2, 3"."""
    noun = "card" if len(cards) == 1 else "cards"
    return f"{noun} {', '.join(map(str, cards))}"


def machine_cards(known: Collection[int]) -> str:
    if not known:
        return "this machine has no GPU"
    return f"this machine has {card_text(sorted(known))}"
