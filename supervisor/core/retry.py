"""Retry policy: which budget a failure is charged to, and how long to back off. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from supervisor.core.jobs import FailureReason

Budget = Literal["ordinary", "gpu_hang"]

# A missing executable or an unusable cwd will not fix itself; a cancel is the user's
# word; a run past its wall-time limit would only run past it again.
NEVER_RETRIED = frozenset(
    {
        FailureReason.SPAWN_FAILED,
        FailureReason.CANCELLED,
        FailureReason.DEPENDENCY_FAILED,
        FailureReason.TIMEOUT,
    }
)


@dataclass(frozen=True)
class Retry:
    delay_s: float
    charge: Budget | None  # None: an interruption, charged to nothing


@dataclass(frozen=True)
class Fail:
    why: str


def budget_for(reason: FailureReason, *, charged: bool = False) -> Budget | None:
    """The budget a failure spends. An interruption spends none (a daemon stop, a drain:
    nothing about the job), unless `charged`: its keeper died under it, which killed the
    job, and a job that keeps taking its keeper down must not run on without limit."""
    if reason is FailureReason.GPU_HANG:
        return "gpu_hang"
    if reason is FailureReason.INTERRUPTED and not charged:
        return None
    return "ordinary"


def next_action(
    reason: FailureReason,
    *,
    ordinary_used: int,
    ordinary_budget: int,
    gpu_hang_used: int,
    gpu_hang_budget: int,
    charged: bool = False,
) -> Retry | Fail:
    """Decide what follows a failed attempt. `*_used` count retries already spent;
    `charged`: an interruption that spends the ordinary budget (budget_for)."""
    if reason in NEVER_RETRIED:
        return Fail(f"{reason.value} is not retried")
    charge = budget_for(reason, charged=charged)
    if charge is None:
        return Retry(0.0, None)
    if charge == "gpu_hang":
        if gpu_hang_used >= gpu_hang_budget:
            return Fail(f"gpu_hang retry budget spent ({gpu_hang_used}/{gpu_hang_budget})")
        # Short and flat: the reset has already happened, the card is usable again.
        return Retry(1.0, "gpu_hang")
    if ordinary_used >= ordinary_budget:
        return Fail(f"retry budget spent ({ordinary_used}/{ordinary_budget})")
    return Retry(min(2.0**ordinary_used, 60.0), "ordinary")
