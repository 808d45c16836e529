"""Waiting for jobs' ends: the end comes with the wake-up, and a wait given up leaves
nothing behind."""

from __future__ import annotations

import dataclasses

import anyio

from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.daemon.waiting import Ends

SPEC = JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0)


def ended(job_id: int) -> Job:
    job = Job(id=job_id, spec=SPEC, submitted_at="2026-12-01T00:00:00.000Z")
    return dataclasses.replace(job, state=JobState.SUCCEEDED)


async def test_a_waiter_gets_the_published_end_and_a_second_one_reads_it_itself() -> None:
    ends, got = Ends(), []

    async def wait(job_id: int) -> None:
        got.append(await ends.until_ended(job_id))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, 5)
        tg.start_soon(wait, 5)
        await anyio.sleep(0.01)
        ends.changed(ended(6))  # nobody waits for 6: nothing is kept of it
        ends.changed(ended(5))
    assert sorted(got, key=lambda j: j is None) == [ended(5), None]
    assert ends._ended == {} and ends._waiting == {}


async def test_a_wait_given_up_leaves_nothing_behind() -> None:
    ends = Ends()
    with anyio.move_on_after(0.01):
        await ends.until_ended(7)
    ends.changed(ended(7))  # the job ends after its waiter left
    assert ends._ended == {} and ends._waiting == {}
