"""The line held back behind a job: what a hang of its card drops before it is killed."""

from __future__ import annotations

import anyio

from supervisor.daemon.running.ahead import Ahead, Sending, behind


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
