"""The engine's table: what `apply` keeps of a step's changes, job by job."""

from __future__ import annotations

import dataclasses

from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Attempt
from supervisor.core.table import Changes, Live, Phase, Table, line_of


def job(job_id: int, state: JobState = JobState.QUEUED, hold: str | None = None) -> Job:
    spec = JobSpec(("x",), "/", {}, 0, 0)
    return Job(job_id, spec, state, hold_reason=hold, waiting_for=hold and f"waiting: {hold}")


def live(job_id: int) -> Live:
    return Live(Attempt(job_id, 1, (0,), "t", "k"), (0,), 1, Phase.RUNNING, None, 0, 0.0)


def test_a_wait_is_recorded_only_for_a_job_still_queued() -> None:
    t = Table()
    t.apply(Changes(jobs={1: job(1), 2: job(2, JobState.RUNNING)}))
    # 3 is not in the table at all (it ended in the same step).
    t.apply(Changes(held_since={1: 5.0, 2: 6.0, 3: 7.0}, announced={1, 2, 3}, settle=[1, 2, 3]))
    assert t.held_since == {1: 5.0}
    assert t.announced == {1}
    assert t.queue.settled_kind == {1: "gpu"}


def test_a_new_hold_of_the_same_wait_is_counted_under_its_new_reason() -> None:
    t = Table()
    t.apply(Changes(jobs={1: job(1, hold="vram"), 2: job(2, hold="vram")}))
    t.apply(Changes(held_since={1: 5.0}, settle=[1]))
    # The words stay, the reason changes: counted anew, and no longer settled.
    moved = dataclasses.replace(job(1, hold="host_ram"), waiting_for="waiting: vram")
    t.apply(Changes(jobs={1: moved}))
    assert t.held_counts() == {"host_ram": 1, "vram": 1}
    assert t.queue.settled_kind == {} and len(t.queue) == 2
    assert t.held_since == {1: 5.0}  # the same wait


def test_the_same_hold_again_keeps_the_job_settled() -> None:
    t = Table()
    t.apply(Changes(jobs={1: job(1, hold="gpus")}))
    t.apply(Changes(held_since={1: 5.0}, settle=[1]))
    t.apply(Changes(jobs={1: job(1, hold="gpus")}))
    assert t.queue.settled_kind == {1: "gpu"} and t.held_counts() == {"gpus": 1}


def test_a_job_that_starts_leaves_its_wait_behind() -> None:
    t = Table()
    t.apply(Changes(jobs={1: job(1, hold="gpus"), 2: job(2)}))
    t.apply(Changes(held_since={1: 5.0, 2: 6.0}, announced={1, 2}))
    changed = t.apply(Changes(jobs={1: job(1, JobState.RUNNING)}, live={1: live(1)}))
    assert changed == [(job(1, hold="gpus"), job(1, JobState.RUNNING))]
    assert t.held_since == {2: 6.0} and t.announced == {2}
    assert t.held_counts() == {} and len(t.queue) == 1 and set(t.live) == {1}


def test_an_ended_job_leaves_the_table_with_everything_kept_for_it() -> None:
    t = Table()
    t.apply(
        Changes(
            jobs={1: job(1, JobState.RUNNING), 2: job(2), 3: job(3, JobState.RUNNING)},
            live={1: live(1), 3: live(3)},
            pending={2: frozenset({1})},
            dependents=[(1, 2), (3, 4)],
        )
    )
    assert t.dependents == {1: {2}, 3: {4}}
    changed = t.apply(Changes(jobs={1: job(1, JobState.SUCCEEDED)}))
    assert changed == [(job(1, JobState.RUNNING), job(1, JobState.SUCCEEDED))]
    assert set(t.jobs) == {2, 3} and set(t.live) == {3} and t.dependents == {3: {4}}
    assert t.pending == {2: frozenset({1})}
    t.apply(Changes(jobs={2: job(2, JobState.CANCELLED)}))
    assert set(t.jobs) == {3} and t.pending == {} and len(t.queue) == 0
    t.apply(Changes(jobs={3: job(3, JobState.FAILED)}))
    assert t.jobs == {} and t.live == {} and t.dependents == {}


def test_seq_and_next_id_change_only_when_given() -> None:
    t = Table()
    t.apply(Changes(seq=4, next_id=10))
    t.apply(Changes())
    assert (t.seq, t.next_id) == (4, 10)


def test_an_attempt_closed_by_a_step_leaves_the_live_ones() -> None:
    t = Table()
    t.apply(Changes(jobs={1: job(1, JobState.RUNNING)}, live={1: live(1)}))
    t.apply(Changes(live={1: None, 2: None}))
    assert t.live == {} and set(t.jobs) == {1}


def test_the_line_a_job_ends_runs_from_its_front_through_each_job_waiting_ahead() -> None:
    def ahead(job_id: int, after: int, phase: Phase = Phase.SPAWNING) -> Live:
        return dataclasses.replace(live(job_id), phase=phase, after=(after, 1))

    lives = {
        1: live(1),
        2: ahead(2, 1),
        3: ahead(3, 2),
        5: ahead(5, 4),
        6: ahead(6, 1, Phase.RUNNING),
    }
    lives[7] = dataclasses.replace(live(7), phase=Phase.SPAWNING)  # an ordinary start
    lives[8] = ahead(8, 7)  # behind it, though it is still being started
    assert line_of(3, lives) == [1, 2, 3]
    assert line_of(1, lives) == [1]
    assert line_of(5, lives) == [5]  # 4 has exited: 5 is being started now, the front
    assert line_of(6, lives) == [6]  # up already, though 1 still runs
    assert line_of(7, lives) == [7]
    assert line_of(8, lives) == [7, 8]


def test_refit_gives_back_the_room_a_big_batch_grew_the_tables_to() -> None:
    import sys

    t = Table()
    empty = {name: sys.getsizeof(getattr(t, name)) for name in ("jobs", "held_since", "announced")}
    n = 20_000
    t.apply(Changes(jobs={i: job(i, hold="gpus") for i in range(1, n + 1)}))
    t.apply(
        Changes(
            held_since={i: 1.0 for i in range(1, n + 1)},
            announced=set(range(1, n + 1)),
            settle=list(range(1, n + 1)),
        )
    )
    ended = {i: dataclasses.replace(job(i), state=JobState.SUCCEEDED) for i in range(2, n + 1)}
    t.apply(Changes(jobs=ended))
    tables = (t.jobs, t.held_since, t.announced, t.queue.settled_kind, t.queue.hold_of)
    grown = [sys.getsizeof(x) for x in tables]
    assert all(size > 100_000 for size in grown)  # the room of 20,000, holding one each
    t.refit()
    assert all(sys.getsizeof(x) < 1_000 for x in tables)
    assert t.jobs == {1: job(1, hold="gpus")} and t.held_since == {1: 1.0}
    assert t.announced == {1} and t.queue.settled_kind == {1: "gpu"}
    assert t.held_counts() == {"gpus": 1} and len(t.queue) == 1
    t.apply(Changes(jobs={1: dataclasses.replace(job(1), state=JobState.SUCCEEDED)}))
    t.refit()
    assert {name: sys.getsizeof(getattr(t, name)) for name in empty} == empty
