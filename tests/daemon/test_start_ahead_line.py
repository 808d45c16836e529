"""How far ahead the dispatch loop claims: behind a short running job, a line of at most
`start_ahead_depth` jobs, the second only on a keeper that parks a spawn behind a parked
one. The daemon's own pass, engine and SQLite store; no process runs."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

import anyio
import pytest

from supervisor.core import admission
from supervisor.core.commands import Dispatch, ProcessStarted, Spawning, Started
from supervisor.core.jobs import JobSpec, JobState
from supervisor.core.table import Line, Phase
from supervisor.daemon import lines
from supervisor.daemon.store.database import Store
from supervisor.daemon.watch.sampling import Sampler
from tests.daemon.test_dispatcher import HOST, Machine, spec

KEY = "k"  # spec()'s memory key


async def line(
    store: Store, depth: int, chains: bool, last_s: float = 0.01
) -> tuple[Machine, list[tuple[int, int]]]:
    """One card, job 1 running; five more of its short kind (its last success took
    `last_s`) queued; passes until none claims more. What was claimed ahead: (job, the
    job it follows)."""
    m = Machine(store, cards=1, cpu_slots=0, wait_s=1e9)
    m.sched.cfg = dataclasses.replace(
        m.sched.cfg, jobs=dataclasses.replace(m.sched.cfg.jobs, start_ahead_depth=depth)
    )
    m.sched.can_follow = lambda _cards: True
    m.sched.can_chain = lambda _cards: chains
    m.sched.last_run_s[KEY] = last_s
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


@pytest.mark.parametrize(
    ("last_s", "claimed"),
    [
        (0.8, [(2, 1), (3, 2)]),  # 3 behind 1 and 2: 1.6 s; 4 behind three: 2.4 s > 2 s
        (1.5, [(2, 1)]),  # 3 behind 1 and 2: 3 s
        (2.5, []),  # a kind that ran long is never followed
    ],
)
async def test_a_line_is_no_longer_than_its_kinds_last_runs_fit_in_start_ahead_s(
    store: Store, last_s: float, claimed: list[tuple[int, int]]
) -> None:
    """start_ahead_s = 2 s: a job is claimed at the end of a line only where the jobs in
    front of it are expected, by their kinds' last successes, to be done by then; the
    depth allowed (4) is not what stops these lines."""
    m, ahead = await line(store, 4, True, last_s)
    assert m.sched.cfg.jobs.start_ahead_s == 2
    assert ahead == claimed


async def test_nothing_is_claimed_behind_a_line_whose_front_has_run_long(store: Store) -> None:
    m, ahead = await line(store, 2, True)
    assert ahead == [(2, 1), (3, 2)]
    live = m.table.live[1]
    m.table.live[1] = dataclasses.replace(
        live, attempt=dataclasses.replace(live.attempt, started_at="2020-01-01T00:00:00.000Z")
    )
    m.table.live.pop(3)  # room for one more in the line, were the front still short
    assert m.sched._followable(time.time()) == []


async def test_one_pass_claims_the_whole_line_of_every_card_and_its_claims_wake_no_pass(
    store: Store,
) -> None:
    """Each claim is planned on the table as the claims before it in the pass left it;
    a claim wakes no further pass (the pass made all it could), anything else does."""
    m = await two_cards_running(store)
    await m.dispatch()  # once
    ahead = sorted((r.after[0], j) for j, r in m.table.live.items() if r.after is not None)
    assert ahead == [(1, 3), (2, 4), (3, 5), (4, 6)]
    assert not m.sched.wake.is_set()
    await m.end(1)
    assert m.sched.wake.is_set()  # an end wakes the loop


async def test_the_claims_of_one_round_share_one_reading_of_the_host_s_memory(
    store: Store,
) -> None:
    """A round fills every card's line; the host's memory and the running jobs' use are
    read once for all of its claims."""
    m = await two_cards_running(store)
    readings: list[int] = []

    def host() -> admission.HostMemory:
        readings.append(len(m.table.live))
        return HOST

    m.sched.host = host  # type: ignore[method-assign]
    uses: list[int] = []
    live_use = m.sched._live_use

    def counted() -> list[admission.RunningJob]:
        uses.append(len(m.table.live))
        return live_use()

    m.sched._live_use = counted  # type: ignore[method-assign]
    await m.dispatch()
    ahead = sorted((r.after[0], j) for j, r in m.table.live.items() if r.after is not None)
    assert ahead == [(1, 3), (2, 4), (3, 5), (4, 6)]
    # The pass's own plan (which commits the holds of the jobs that wait), then one
    # reading for the round's claims, the table as the pass's commit left it; the running
    # jobs' use is read with it, and each claim of the round added to it.
    assert readings == [2, 2]
    assert uses == [2, 2]


async def test_a_pause_that_comes_while_a_claim_commits_stops_the_pass_claiming(
    store: Store,
) -> None:
    """A round fills the lines; a pause that came while it committed stops the pass,
    though a job in front has since left a line room for one more."""
    m = await two_cards_running(store)
    real, calls = m.sched.cards_now, []

    def cards_now() -> list[admission.Card]:
        calls.append(1)
        if len(calls) == 3:  # read after the first round's claims: `gpusv pause` came meanwhile
            m.sched.paused = True
            m.table.live.pop(1)  # the front of card 0's line left (as its end would)
        return real()

    m.sched.cards_now = cards_now  # type: ignore[method-assign]
    await m.dispatch()
    # The first round claimed the whole line of each card, in one commit; none after it.
    ahead = sorted((r.after[0], j) for j, r in m.table.live.items() if r.after is not None)
    assert ahead == [(1, 3), (2, 4), (3, 5), (4, 6)]


async def running_two(store: Store, *specs: JobSpec) -> Machine:
    """Two cards; `specs` submitted, the first two started, one on each card, as jobs of
    a short kind that may be followed (learnt once they were claimed: nothing is claimed
    behind them yet); the rest queued."""
    m = Machine(store, cards=2, cpu_slots=0, wait_s=1e9)
    m.sched.can_follow = m.sched.can_chain = lambda _cards: True
    await m.submit(*specs)
    await m.dispatch()
    m.sched.last_run_s[KEY] = 0.01
    for job in (1, 2):
        await m.engine.do(Spawning(job, 1))
        await m.engine.do(Started(job, 1, 4240 + job, time.time()))
    return m


async def two_cards_running(store: Store) -> Machine:
    """Two cards, each running a job of a short kind, lines of two; six more queued."""
    m = await running_two(store, *[spec()] * 8)
    m.sched.cfg = dataclasses.replace(
        m.sched.cfg, jobs=dataclasses.replace(m.sched.cfg.jobs, start_ahead_depth=2)
    )
    m.sched.wake = anyio.Event()
    return m


async def test_a_job_submitted_while_a_pass_commits_goes_to_the_idle_card_not_into_a_line(
    store: Store,
) -> None:
    """The pass planned before the job came, then waited for the engine while it was
    submitted: it claims nothing ahead on that stale plan, and the pass that the submit
    woke starts the job on the card that is idle."""
    m = Machine(store, cards=2, cpu_slots=0, wait_s=1e9)
    m.sched.can_follow = m.sched.can_chain = lambda _cards: True
    m.sched.last_run_s[KEY] = 0.01
    await m.submit(spec())
    await m.dispatch()
    await m.engine.do(Spawning(1, 1))
    await m.engine.do(Started(1, 1, 4241, time.time()))
    await m.submit(spec(vram_mb=40_000))  # fits no card: held, so the pass commits its hold
    await m.engine._turn.acquire()
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.submit, spec())  # job 3: waits for the turn first
        await anyio.sleep(0)
        tg.start_soon(m.dispatch)  # plans without job 3, then waits for the turn
        await anyio.sleep(0.05)
        m.engine._turn.release()
    assert 3 not in m.table.live  # not claimed behind job 1 on the stale plan
    assert m.sched.wake.is_set()
    await m.dispatch()
    assert m.running()[3] != m.running()[1] and m.table.live[3].after is None


async def test_the_job_claimed_ahead_is_the_first_that_fits_beside_even_past_one_that_does_not(
    store: Store,
) -> None:
    """The claim ahead reads the first queued job alone; where that one does not fit
    beside the running job (host RAM), the plan reads on and claims the next that does."""
    m = Machine(store, cards=1, cpu_slots=0, wait_s=1e9)
    m.sched.can_follow = m.sched.can_chain = lambda _cards: True
    m.sched.last_run_s[KEY] = 0.01
    await m.submit(spec(mem_mb=50_000), spec(mem_mb=50_000), spec(mem_mb=1_000))
    await m.dispatch()
    await m.engine.do(Spawning(1, 1))
    await m.engine.do(Started(1, 1, 4241, time.time()))
    await m.dispatch()
    ahead = {j: r.after for j, r in m.table.live.items() if r.after is not None}
    assert ahead == {3: (1, 1)}  # 2 would need 100 GB of the 89 GB RAM beside job 1
    assert 2 in m.waiting()  # still queued


async def test_a_start_told_while_a_pass_claims_lets_it_go_on_claiming(store: Store) -> None:
    """A process started elsewhere asks for a pass (it may be followed) but changes
    nothing the pass's plan must see anew: its claims go on."""
    m = await two_cards_running(store)
    real = m.sched.cards_now

    def cards_now() -> list[admission.Card]:
        m.engine.broker.publish(ProcessStarted(2, 4242))  # as a keeper's answer would
        return real()

    m.sched.cards_now = cards_now  # type: ignore[method-assign]
    await m.dispatch()
    assert sum(1 for r in m.table.live.values() if r.after is not None) == 4
    assert m.sched.wake.is_set()  # a pass follows, to follow what started


async def test_a_round_fills_every_line_in_one_dispatch(store: Store) -> None:
    """A job behind each card's line, then one behind each of those, planned in turn (the
    queue's order is the order the cards come to its jobs) and committed together: one
    engine turn for the round, not one for each claim."""
    m = await two_cards_running(store)
    real, dispatched = m.engine.do, []

    async def do(cmd: object) -> object:
        if isinstance(cmd, Dispatch):
            dispatched.append(sorted((s.job_id, s.after) for s in cmd.starts))
        return await real(cmd)  # type: ignore[arg-type]

    m.engine.do = do  # type: ignore[assignment,method-assign]
    await m.dispatch()
    assert dispatched == [[(3, (1, 1)), (4, (2, 1)), (5, (3, 1)), (6, (4, 1))]]


async def test_a_claim_of_a_round_counts_the_memory_of_those_claimed_before_it(
    store: Store,
) -> None:
    """Two lines, two queued jobs that fit beside the running ones one at a time, not both
    (89 GB of RAM): the round claims the first behind one line, and the second, planned
    with the first's memory taken, stays queued rather than joining the other line."""
    m = await running_two(store, *[spec(mem_mb=1_000)] * 2, *[spec(mem_mb=45_000)] * 2)
    await m.dispatch()
    ahead = {j: r.after for j, r in m.table.live.items() if r.after is not None}
    assert ahead == {3: (1, 1)}
    assert 4 in m.waiting()


async def test_a_claim_of_a_round_counts_the_array_jobs_claimed_before_it(store: Store) -> None:
    """An array capped at three runs two on two cards: the round claims one more behind
    one line, and none behind the other, which would make four of it."""
    m = await running_two(store, *[spec(array_index=i, max_running=3) for i in range(4)])
    await m.dispatch()
    ahead = {j: r.after for j, r in m.table.live.items() if r.after is not None}
    assert ahead == {3: (1, 1)}
    assert 4 in m.waiting()


async def test_releasing_the_overrun_lines_reads_each_line_anew(store: Store) -> None:
    """Both cards' fronts ran past twice start_ahead_s; while the job behind the first is
    let go (an engine turn), the second card's front ends and its follower starts: that
    one is left alone (it is no longer waiting), and the sampler goes on (it once raised
    KeyError there, which ended the daemon)."""
    m = await two_cards_running(store)
    m.sched.cfg = dataclasses.replace(
        m.sched.cfg, jobs=dataclasses.replace(m.sched.cfg.jobs, start_ahead_depth=1)
    )
    await m.dispatch()
    assert {j: r.after for j, r in m.table.live.items() if r.after} == {3: (1, 1), 4: (2, 1)}
    sampler = Sampler(m.sched.cfg, m.engine, *(cast(Any, None),) * 4)
    sampler.dispatcher = m.sched
    sampler.ahead_s = 0.001
    time.sleep(0.01)  # both fronts are past 2 ms now
    real, released = m.sched.release_ahead, []

    async def release_ahead(message: str, job_ids: list[int]) -> None:
        released.extend(job_ids)
        if 2 in m.table.live:  # the other card's front exits meanwhile
            await m.end(2)
        await real(message, job_ids)

    m.sched.release_ahead = release_ahead  # type: ignore[assignment,method-assign]
    await sampler._overrun()
    assert released == [3]
    assert m.table.jobs[3].state is JobState.QUEUED  # back in the queue
    assert m.table.live[4].after == (2, 1) and 2 not in m.table.live  # its turn: left alone


async def test_the_pass_that_claims_a_card_s_job_claims_the_line_behind_it_too(
    store: Store,
) -> None:
    """A line may form behind a job still being started: a batch's first pass on idle
    cards claims each card's first job and the jobs behind it, in one pass."""
    m = Machine(store, cards=2, cpu_slots=0, wait_s=1e9)
    m.sched.can_follow = m.sched.can_chain = lambda _cards: True
    m.sched.last_run_s[KEY] = 0.01
    m.sched.cfg = dataclasses.replace(
        m.sched.cfg, jobs=dataclasses.replace(m.sched.cfg.jobs, start_ahead_depth=2)
    )
    await m.submit(*[spec()] * 8)
    await m.dispatch()
    ahead = sorted((r.after[0], j) for j, r in m.table.live.items() if r.after is not None)
    assert ahead == [(1, 3), (2, 4), (3, 5), (4, 6)]
    assert {m.table.live[j].phase for j in (1, 2)} == {Phase.CLAIMED}  # not started yet
    assert sorted(m.waiting()) == [7, 8]


async def test_a_pass_that_would_only_refill_lines_waits_a_share_of_the_shortest_line(
    store: Store,
) -> None:
    """After an end, the line it shortened has room: the next pass would only refill it
    (no card is free), so it may wait for more ends, a quarter of what the line holds
    (two jobs of 10 ms), and not at all while something could start or nothing may."""
    m = await two_cards_running(store)
    await m.dispatch()  # lines of two behind 1 and 2; jobs 7 and 8 queued
    assert m.sched.refill_pause() == 0.0  # every line is full: nothing to refill
    await m.end(1)  # 3 is the front now: its line [3, 5] has room for one more
    m.sched.last_run_s[KEY] = 0.01  # as before 1's end taught it its own run
    assert m.sched.refill_pause() == pytest.approx(0.02 / lines.PAUSE_SHARE)
    m.sched.last_run_s[KEY] = 1.0  # a line of two 1 s jobs: the most it waits
    assert m.sched.refill_pause() == lines.PAUSE_MAX_S
    m.sched.set_paused(True)
    assert m.sched.refill_pause() == 0.0
    m.sched.set_paused(False)
    m.table.live.pop(2)  # card 1 free (its line goes with it): a pass may start a job
    m.table.live.pop(4)
    m.table.live.pop(6)
    assert m.sched.refill_pause() == 0.0


def test_a_refill_waits_for_no_line_about_to_run_dry() -> None:
    line = Line((1, 1), (0,), 1, 0.002)
    assert lines.refill_pause([]) == 0.0
    assert lines.refill_pause([line]) == pytest.approx(0.0005)
    assert lines.refill_pause([line._replace(spent_s=5.0), line]) == pytest.approx(0.0005)
    assert lines.refill_pause([line._replace(spent_s=5.0)]) == lines.PAUSE_MAX_S
