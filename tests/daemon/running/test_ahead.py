"""The line held back behind a job: what a hang of its card drops before it is killed; and
the order in which a line's spawns reach their keeper."""

from __future__ import annotations

import anyio

from supervisor.core.commands import Spawn
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Attempt
from supervisor.daemon.running.ahead import Ahead, Sending, behind
from supervisor.daemon.running.runner import Runner


def test_the_line_behind_a_job_is_what_follows_it_and_what_follows_those() -> None:
    aheads = {2: Ahead((1, 1)), 5: Ahead((4, 1)), 3: Ahead((2, 1)), 6: Ahead((3, 1))}
    assert behind(aheads, 1) == [aheads[2], aheads[3], aheads[6]]
    assert behind(aheads, 4) == [aheads[5]]
    assert behind(aheads, 3) == [aheads[6]]
    assert behind(aheads, 6) == []


async def test_a_spawn_behind_another_of_its_round_goes_once_that_one_went() -> None:
    """A keeper starts a spawn whose `after` it never heard of at once: the spawn behind
    one still to be written waits for it, and does not go if that one never does."""
    front, dropped = Sending(), Sending()
    second, third = Sending(front), Sending(dropped)
    order: list[str] = []

    async def follow(name: str, s: Sending) -> None:
        order.append(f"{name} {'goes' if await s.front_sent() else 'stays'}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow, "second", second)
        tg.start_soon(follow, "third", third)
        await anyio.sleep(0.01)
        assert order == []  # neither in front was written yet
        order.append("front written")
        front.written()
        dropped.over.set()  # given up before it was written (a stop, a keeper gone)
    assert order == ["front written", "second goes", "third stays"]
    assert await Sending().front_sent()  # nothing in front left to send: it goes


class _Started:
    """A runner's task set that only notes what it was asked to start."""

    def __init__(self) -> None:
        self.orders: list[object] = []

    def start_soon(self, _fn: object, order: object) -> None:
        self.orders.append(order)


def test_a_spawn_claimed_behind_one_not_yet_sent_waits_for_that_one_whatever_it_is() -> None:
    """A line may form behind a job still being started (an ordinary spawn, or one claimed
    ahead itself): each spawn is noted from its order until it is on its keeper's
    connection, so the one behind it is sent only after it."""
    runner = Runner.__new__(Runner)
    runner._tasks, runner._sending = _Started(), {}  # type: ignore[assignment]
    spec = JobSpec(("true",), "/", {}, 0, 0, gpus=1)
    jobs = [Job(i, spec, state=JobState.RUNNING) for i in (1, 2, 3)]
    spawns = [
        Spawn(jobs[0], Attempt(1, 1, (0,), "t", "k"), (0,), 1),
        Spawn(jobs[1], Attempt(2, 1, (0,), "t", "k"), (0,), 2, after=(1, 1)),
        Spawn(jobs[2], Attempt(3, 1, (0,), "t", "k"), (0,), 3, after=(2, 1)),
    ]
    for order in spawns:
        runner._order(order)
    sending = runner._sending
    assert sending[1].front is None
    assert sending[2].front is sending[1] and sending[3].front is sending[2]
