"""Waiting for jobs' ends: each end comes with the wake-up to every request that watches
the job, ends that come while a request still waits for an earlier job are kept for it,
and a wait given up leaves nothing behind."""

from __future__ import annotations

import dataclasses

import anyio

from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.daemon.requests.waiting import Ends

SPEC = JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0)


def ended(job_id: int) -> Job:
    job = Job(id=job_id, spec=SPEC, submitted_at="2026-12-01T00:00:00.000Z")
    return dataclasses.replace(job, state=JobState.SUCCEEDED)


async def test_two_requests_for_one_job_each_get_the_published_end() -> None:
    ends, got = Ends(), []

    async def wait(job_id: int) -> None:
        with ends.watching() as watch:
            got.append(await watch.until_ended(job_id))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, 5)
        tg.start_soon(wait, 5)
        await anyio.sleep(0.01)
        ends.changed(ended(6))  # nobody waits for 6: nothing is kept of it
        ends.changed(ended(5))
    assert got == [ended(5), ended(5)]
    assert ends._watches == {}


async def test_ends_that_come_while_the_first_is_awaited_are_kept_for_the_request() -> None:
    ends, got = Ends(), []

    async def wait(job_ids: list[int]) -> None:
        with ends.watching(job_ids) as watch:
            for job_id in job_ids:
                got.append(await watch.until_ended(job_id))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, [1, 2, 3])
        await anyio.sleep(0.01)
        ends.changed(ended(3))  # before the request is done with 1
        ends.changed(ended(2))
        await anyio.sleep(0.01)
        assert got == []
        ends.changed(ended(1))
    assert [j.id for j in got] == [1, 2, 3]
    assert ends._watches == {}


async def test_a_wait_given_up_leaves_nothing_behind() -> None:
    ends = Ends()
    with anyio.move_on_after(0.01), ends.watching([7, 8]) as watch:
        await watch.until_ended(7)
    ends.changed(ended(7))  # the job ends after its waiter left
    assert ends._watches == {} and watch.ended == {}
