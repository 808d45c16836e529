"""A pass that claims a few jobs and holds many commits its claims without the holds'
rows; the passes after it write each wait's `queue_wait` event once, a chunk a turn, and
none for a job that no longer waits. The daemon's own pass, engine and SQLite store; a
free CPU slot, as a daemon has by default, so that a pass reads on past the full cards
and holds every card job after them."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.commands import Command, Dispatch
from supervisor.core.draft import Step
from supervisor.daemon import waits
from supervisor.daemon.store.database import Store
from tests.daemon.test_dispatcher import Machine, spec

ONE_GPU_NONE_FREE = "waiting for 1 free GPU, 0 free"


async def queue_waits(store: Store, ids: Sequence[int]) -> dict[int, int]:
    """Job -> how many queue_wait events it has."""
    return {
        job_id: sum(ev["kind"] == "queue_wait" for ev in await store.events(job_id))
        for job_id in ids
    }


def turns(m: Machine) -> list[Command]:
    """Every Dispatch the engine takes from now on, as it takes it."""
    seen: list[Command] = []
    take = m.engine._take

    async def counted(cmds: tuple[Command, ...], request: str | None = None) -> Step:
        seen.extend(c for c in cmds if isinstance(c, Dispatch))
        return await take(cmds, request)

    m.engine._take = counted  # type: ignore[method-assign]
    return seen


async def test_a_first_pass_commits_its_claims_and_the_next_writes_the_waits(
    store: Store,
) -> None:
    m = Machine(store, cards=2, cpu_slots=1, wait_s=1e9)
    n = 2 + 2 * waits.AT_ONCE + 10  # three turns' worth of holds
    await m.submit(*[spec()] * n)
    queued = range(3, n + 1)
    delay = await m.sched.dispatch_pass()
    assert m.running() == {1: (0,), 2: (1,)}
    # Shown and settled at once; not yet written.
    assert set(m.waiting().values()) == {ONE_GPU_NONE_FREE}
    assert len(m.table.queue.settled["gpu"]) == n - 2 and not m.table.queue.live
    assert set((await queue_waits(store, queued)).values()) == {0}
    assert len(m.sched.waits) == n - 2
    assert delay is not None and delay <= waits.AFTER_S  # a pass follows soon
    seen = turns(m)
    await m.end(1)  # the next pass claims job 3: no wait to write for it
    await m.dispatch()
    assert m.running() == {2: (1,), 3: (0,)}
    assert len(m.sched.waits) == n - 2  # a pass that claims writes none: the next does
    assert await m.sched.dispatch_pass() is None
    written = await queue_waits(store, queued)
    assert written == {job_id: int(job_id != 3) for job_id in queued}
    holds = [len(d.holds) for d in seen if isinstance(d, Dispatch) and not d.starts]
    # Three turns (the second pass held and wrote the few it read itself, at once).
    assert len(holds) == 3 and max(holds) == waits.AT_ONCE
    assert not m.sched.waits and m.table.announced == set(range(4, n + 1))
    await m.dispatch()
    assert sum((await queue_waits(store, queued)).values()) == n - 3  # once a wait


async def test_a_pass_with_few_holds_writes_them_with_its_claims(store: Store) -> None:
    m = Machine(store, cards=2, cpu_slots=1, wait_s=1e9)
    await m.submit(*[spec()] * 5)
    await m.dispatch()
    assert await queue_waits(store, range(1, 6)) == {1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    assert not m.sched.waits


async def test_a_wait_shown_anew_before_it_is_written_is_written_as_shown(store: Store) -> None:
    """Written later, a wait is the one its job shows then, not the one first planned."""
    m = Machine(store, cards=2, cpu_slots=1, wait_s=1e9)
    n = 2 + waits.AT_ONCE + 1
    await m.submit(*[spec()] * n)
    await m.dispatch()
    job = m.table.jobs[n]
    m.table.jobs[n] = type(job)(**{**vars(job), "waiting_for": "shown anew"})
    await m.sched.waits.announce()
    assert [ev["message"] for ev in await store.events(n) if ev["kind"] == "queue_wait"] == [
        "shown anew"
    ]
