"""How far ahead the dispatch loop claims: behind a short running job, a line of at most
`start_ahead_depth` jobs, the second only on a keeper that parks a spawn behind a parked
one. The daemon's own pass, engine and SQLite store; no process runs."""

from __future__ import annotations

import dataclasses
import time

import pytest

from supervisor.core.commands import Spawning, Started
from supervisor.daemon.store import Store

from .test_jobqueue import Machine, spec

KEY = "k"  # spec()'s memory key


async def line(store: Store, depth: int, chains: bool) -> tuple[Machine, list[tuple[int, int]]]:
    """One card, job 1 running; five more of its short kind queued; passes until none
    claims more. What was claimed ahead: (job, the job it follows)."""
    m = Machine(store, cards=1, cpu_slots=0, wait_s=1e9)
    m.sched.cfg = dataclasses.replace(
        m.sched.cfg, jobs=dataclasses.replace(m.sched.cfg.jobs, start_ahead_depth=depth)
    )
    m.sched.can_follow = lambda _cards: True
    m.sched.can_chain = lambda _cards: chains
    m.sched.short[KEY] = 0.01  # its last success took 10 ms
    await m.submit(*[spec()] * 6)
    await m.dispatch()
    await m.engine.do(Spawning(1, 1))
    await m.engine.do(Started(1, 1, 4242, time.time()))
    for _ in range(8):
        await m.dispatch()
    ahead = [(j, r.after[0]) for j, r in m.table.live.items() if r.after is not None]
    return m, ahead


@pytest.mark.parametrize(
    ("depth", "chains", "claimed"),
    [
        (1, True, [(2, 1)]),
        (2, True, [(2, 1), (3, 2)]),
        (3, True, [(2, 1), (3, 2), (4, 3)]),
        (3, False, [(2, 1)]),  # a keeper without after_waiting: one, behind the running job
    ],
)
async def test_a_line_behind_a_short_job_is_as_deep_as_allowed(
    store: Store, depth: int, chains: bool, claimed: list[tuple[int, int]]
) -> None:
    m, ahead = await line(store, depth, chains)
    assert ahead == claimed
    assert sorted(m.waiting()) == list(range(len(claimed) + 2, 7))  # the rest stay queued


async def test_nothing_is_claimed_behind_a_line_whose_front_has_run_long(store: Store) -> None:
    m, ahead = await line(store, 2, True)
    assert ahead == [(2, 1), (3, 2)]
    live = m.table.live[1]
    m.table.live[1] = dataclasses.replace(
        live, attempt=dataclasses.replace(live.attempt, started_at="2020-01-01T00:00:00.000Z")
    )
    m.table.live.pop(3)  # room for one more in the line, were the front still short
    assert m.sched._followable(time.time()) == []
