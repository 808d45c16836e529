"""The lines ahead (docs/architecture.md, "Starting ahead"): which may take another job,
and how long a pass that would only refill them waits for more ends.

On short jobs a job ends every millisecond or so, and each end woke a pass that claimed
the one job behind its line: a plan, an engine turn and a commit a job. Where all the
next pass could do is refill lines (no card or CPU slot is free, or every queued job is
settled: held for a kind of device none of which is free), it waits a little first, so
that its round claims behind several ends at once (Dispatcher.refill_pause). The wait is
a share of the shortest line's expected run (the last successes of its jobs' kinds), so
that no line runs dry meanwhile, and never more than PAUSE_MAX_S. A stop needs no pass,
and a pass that a free unit could start a job on is not made to wait.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from supervisor.core.jobs import JobSpec
from supervisor.core.table import Line, Live, line_room
from supervisor.daemon.clock import epoch_from_iso
from supervisor.daemon.config import JobsConfig

PAUSE_MAX_S = 0.01
PAUSE_SHARE = 4  # of the shortest line's expected run: it keeps 3/4 of it in hand

Cards = Callable[[tuple[int, ...]], bool]


def followable(
    lives: Mapping[int, Live],
    spec_of: Callable[[int], JobSpec | None],
    last_run_s: Mapping[str, float],
    cfg: JobsConfig,
    keeper: tuple[Cards, Cards],
    now_wall: float,
) -> list[Line]:
    """Jobs a next one may be claimed behind: not being stopped, on one card of their own
    or a CPU slot, nothing claimed behind them yet, each at the end of a line (itself, or
    behind a job up for less than `start_ahead_s`) whose kinds' last successes add up to
    at most that, and no longer than `start_ahead_depth` and the keeper allow (`keeper`:
    whether it follows a job on these cards, and one that waits itself). So the next job
    is not bound to a card or slot that another might free up first."""
    limit, depth = cfg.start_ahead_s, cfg.start_ahead_depth
    can_follow, can_chain = keeper

    def took(job_id: int) -> float:
        return last_run(spec_of(job_id), last_run_s)

    behind = {r.after[0] for r in lives.values() if r.after is not None}
    out = []
    for job_id, live in lives.items():
        if live.kill is not None or job_id in behind:
            continue
        spec = spec_of(job_id)
        if len(live.cards) > 1 or spec is None or spec.share or not can_follow(live.cards):
            continue
        if last_run_s.get(spec.mem_key, limit + 1) > limit:
            continue
        line = line_room(job_id, lives, depth, can_chain(live.cards), took)
        # The next job would start once the whole line has run: it must be expected to,
        # by its kinds' last runs, within start_ahead_s.
        if line.room <= 0 or line.spent_s > limit:
            continue
        if now_wall - epoch_from_iso(lives[line.front].attempt.started_at) < limit:
            out.append(Line((job_id, live.attempt.n), live.cards, line.room, line.spent_s))
    return out


def last_run(spec: JobSpec | None, last_run_s: Mapping[str, float]) -> float:
    """Its kind's last success, s (inf: unknown)."""
    return last_run_s.get(spec.mem_key, float("inf")) if spec else float("inf")


def refill_pause(lines: Sequence[Line]) -> float:
    """Seconds to wait before refilling `lines` (those that may take more); none while
    one of them is about to run dry, or there are none."""
    return min(PAUSE_MAX_S, min((line.spent_s for line in lines), default=0.0) / PAUSE_SHARE)
