"""`update`: the request that changes queued jobs (priority, time limit, cards)."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.wire.durations import MAX_DURATION_S
from supervisor.wire.fields import _Fields

PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000


@dataclass(frozen=True)
class Update:
    """New values for queued jobs; None leaves a value as it is. `cards` () unpins."""

    ids: tuple[int, ...]
    priority: int | None = None
    time_limit_s: float | None = None
    cards: tuple[int, ...] | None = None
    type: str = "update"


def parse_update(f: _Fields, max_card: int) -> Update:
    ids = f.int_list("ids", 10_000)
    if not ids:
        raise f.fail("ids", "at least one job id is required")
    update = Update(
        ids=tuple(ids),
        priority=f.int_("priority", None, PRIORITY_MIN, PRIORITY_MAX),
        time_limit_s=f.float_("time_limit_s", 1e-3, MAX_DURATION_S),
        cards=f.card_list("cards", max_card),
    )
    f.done()
    if (update.priority, update.time_limit_s, update.cards) == (None, None, None):
        raise f.fail("priority", "give at least one of priority, time_limit_s, cards")
    return update
