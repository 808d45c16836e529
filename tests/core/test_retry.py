"""The retry policy by table: which budget each failure is charged to, when a budget is
spent, and the backoff. Each expected value is written out."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.jobs import FailureReason
from supervisor.core.retry import NEVER_RETRIED, Fail, Retry, budget_for, next_action

R = FailureReason


@pytest.mark.parametrize(
    ("reason", "budget"),
    [
        (R.EXIT_NONZERO, "ordinary"),
        (R.SIGNAL, "ordinary"),
        (R.OOM_KILLED, "ordinary"),
        (R.SPAWN_FAILED, "ordinary"),
        (R.CANCELLED, "ordinary"),
        (R.DEPENDENCY_FAILED, "ordinary"),
        (R.GPU_HANG, "gpu_hang"),
        (R.INTERRUPTED, None),
    ],
)
def test_budget_for(reason: FailureReason, budget: str | None) -> None:
    assert budget_for(reason) == budget


def test_never_retried() -> None:
    assert {R.SPAWN_FAILED, R.CANCELLED, R.DEPENDENCY_FAILED, R.TIMEOUT} == NEVER_RETRIED


def act(reason: FailureReason, ordinary: tuple[int, int], hang: tuple[int, int]) -> Retry | Fail:
    return next_action(
        reason,
        ordinary_used=ordinary[0],
        ordinary_budget=ordinary[1],
        gpu_hang_used=hang[0],
        gpu_hang_budget=hang[1],
    )


@pytest.mark.parametrize(
    ("reason", "ordinary", "hang", "expected"),
    [
        # ordinary failures back off 1, 2, 4, ... s, capped at 60 s
        (R.EXIT_NONZERO, (0, 3), (0, 20), Retry(1.0, "ordinary")),
        (R.EXIT_NONZERO, (1, 3), (0, 20), Retry(2.0, "ordinary")),
        (R.EXIT_NONZERO, (2, 3), (0, 20), Retry(4.0, "ordinary")),
        (R.SIGNAL, (5, 9), (0, 20), Retry(32.0, "ordinary")),
        (R.OOM_KILLED, (6, 9), (0, 20), Retry(60.0, "ordinary")),
        (R.OOM_KILLED, (8, 9), (0, 20), Retry(60.0, "ordinary")),
        # a spent ordinary budget fails, whatever is left of the hang budget
        (R.EXIT_NONZERO, (3, 3), (0, 20), Fail("retry budget spent (3/3)")),
        (R.SIGNAL, (4, 3), (0, 20), Fail("retry budget spent (4/3)")),
        (R.EXIT_NONZERO, (0, 0), (0, 20), Fail("retry budget spent (0/0)")),
        # hangs: a short flat delay, charged to their own budget
        (R.GPU_HANG, (3, 3), (0, 20), Retry(1.0, "gpu_hang")),
        (R.GPU_HANG, (0, 3), (19, 20), Retry(1.0, "gpu_hang")),
        (R.GPU_HANG, (0, 3), (20, 20), Fail("gpu_hang retry budget spent (20/20)")),
        (R.GPU_HANG, (0, 3), (0, 0), Fail("gpu_hang retry budget spent (0/0)")),
        # an interruption costs nothing and comes back at once, even with budgets spent
        (R.INTERRUPTED, (3, 3), (20, 20), Retry(0.0, None)),
        # never retried, whatever is left
        (R.SPAWN_FAILED, (0, 3), (0, 20), Fail("spawn_failed is not retried")),
        (R.CANCELLED, (0, 3), (0, 20), Fail("cancelled is not retried")),
        (R.DEPENDENCY_FAILED, (0, 3), (0, 20), Fail("dependency_failed is not retried")),
    ],
)
def test_next_action(
    reason: FailureReason, ordinary: tuple[int, int], hang: tuple[int, int], expected: object
) -> None:
    assert act(reason, ordinary, hang) == expected


def test_an_interruption_by_a_keeper_death_is_charged() -> None:
    assert budget_for(R.INTERRUPTED, charged=True) == "ordinary"
    budgets: dict[str, Any] = {"ordinary_budget": 0, "gpu_hang_used": 0, "gpu_hang_budget": 0}
    assert next_action(R.INTERRUPTED, ordinary_used=0, **budgets) == Retry(0.0, None)
    spent = next_action(R.INTERRUPTED, ordinary_used=0, charged=True, **budgets)
    assert isinstance(spent, Fail)
    budgets["ordinary_budget"] = 1
    assert next_action(R.INTERRUPTED, ordinary_used=0, charged=True, **budgets) == Retry(
        1.0, "ordinary"
    )
