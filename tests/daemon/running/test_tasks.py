"""The runner's tasks keep a task group's rules: a failure ends the whole with its error,
and the whole's end cancels every task and waits for each one's clean-up."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from supervisor.daemon.running.tasks import Tasks


async def test_a_task_that_fails_ends_the_whole_with_its_error_and_the_rest_are_cancelled() -> None:
    tasks, cleaned = Tasks(), []

    async def waits(name: str) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            await asyncio.sleep(0.01)  # a clean-up that itself waits is waited for
            cleaned.append(name)

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("broken")

    tasks.start_soon(waits, "a")
    tasks.start_soon(waits, "b")
    tasks.start_soon(fails)
    with pytest.raises(ValueError, match="broken"):
        await asyncio.wait_for(tasks.run(), 5)
    assert sorted(cleaned) == ["a", "b"]


async def test_a_cancelled_whole_cancels_its_tasks_even_one_started_while_it_ends() -> None:
    tasks, cleaned, finished = Tasks(), [], []

    async def waits(name: str) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            if name == "a":  # a task started while the whole ends is cancelled too
                tasks.start_soon(waits, "late")
            cleaned.append(name)

    async def returns() -> None:
        finished.append("quick")

    tasks.start_soon(waits, "a")
    tasks.start_soon(returns)
    with anyio.move_on_after(0.05):
        await tasks.run()
    assert sorted(cleaned) == ["a", "late"] and finished == ["quick"]


async def test_tasks_that_end_are_let_go() -> None:
    tasks = Tasks()

    async def returns() -> None:
        pass

    for _ in range(100):
        tasks.start_soon(returns)
    await asyncio.sleep(0.01)
    assert not tasks._live
