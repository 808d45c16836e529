"""Start-up reconciliation over a real SQLite store left as a daemon killed at some
instant leaves it: what the store holds, what keepers hold (records given by a stand-in
for the keepers, which are real processes elsewhere: tests/integration/test_keeper*.py),
and leftover processes of attempts older than keepers (real ones, killed or not by pid
and start time)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import psutil
import pytest

from supervisor.core.commands import Changed, InsertJob, SaveJob, SubmitJobs, Write
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.projection import Projection
from supervisor.core.records import Attempt
from supervisor.daemon.broker import Broker
from supervisor.daemon.engine import Engine, submitted_ids
from supervisor.daemon.life.recovery import reconcile
from supervisor.daemon.running.keepers import KeeperGone
from supervisor.daemon.store.commit import commit
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.keeper.client import KeeperError
from supervisor.keeper.journal import Record

T0 = "2026-01-02T03:04:05.000Z"


def spec(**kw: Any) -> JobSpec:
    return JobSpec(("true",), "/", {}, 1000, 1000, mem_key=kw.pop("mem_key", "k"), **kw)


def running(job_id: int, **kw: Any) -> Job:
    given: dict[str, Any] = {"gpus": (0,), "attempts": 1} | kw
    return Job(job_id, given.pop("spec", spec()), JobState.RUNNING, T0, T0, **given)


async def stored(store: Store, *jobs: Job, attempts: tuple[Attempt, ...] = ()) -> None:
    """The jobs as rows (inserted, then saved as they are) and their open attempts."""
    await commit(store, [InsertJob(Job(j.id, j.spec, submitted_at=T0)) for j in jobs])
    by_job = {a.job_id: a for a in attempts}
    writes: list[Write] = [SaveJob(j, T0, new_attempt=by_job.pop(j.id, None)) for j in jobs]
    await commit(store, writes)


@dataclass
class Kept:
    """What recovery uses of a process a keeper holds: its record, kill, wait, ack."""

    record: Record
    calls: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def start_time(self) -> float:
        return self.record.started_at

    fails: Exception | None = None  # what its keeper answers a kill with

    async def kill(self, grace: float) -> None:
        self.calls.append(f"kill {grace}")
        if self.fails is not None:
            raise self.fails

    async def wait(self) -> None:
        self.calls.append("wait")

    async def ack(self) -> None:
        self.calls.append("ack")


class Keepers:
    def __init__(self, *kept: Kept) -> None:
        self.kept = {k.record.key: k for k in kept}

    async def ensure_all(self) -> dict[tuple[int, int], Kept]:
        return dict(self.kept)


class Runner:
    def __init__(self) -> None:
        self.adopted: list[tuple[int, int, tuple[int, ...], int, Kept]] = []

    def adopt(self, job_id: int, n: int, cards: tuple[int, ...], seq: int, proc: Kept) -> None:
        self.adopted.append((job_id, n, cards, seq, proc))


class Daemon:
    """A fresh engine on the store, as a restart makes one, and what it published."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.broker = Broker()
        self.engine = Engine(store, self.broker)
        self.book = MemoryBook(store, self.broker, margin=0.1)
        self.changed: list[Job] = []
        self.broker.subscribe(Changed, lambda ev: self.changed.append(ev.new))

    async def reconcile(self, keepers: Keepers | None = None, runner: Runner | None = None) -> None:
        await reconcile(self.engine, self.store, self.book, cast(Any, keepers), cast(Any, runner))


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A process of an attempt started before keepers: its own process group."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def record(job: int, attempt: int, **kw: Any) -> Record:
    return Record(job, attempt, pid=kw.pop("pid", 999_999), start_ticks=1, started_at=5.0, **kw)


async def test_queued_jobs_stay_queued_and_are_announced(store: Store) -> None:
    await stored(store, Job(1, spec(mem_key="a"), submitted_at=T0), Job(2, spec(), submitted_at=T0))
    d = Daemon(store)
    await d.reconcile()
    assert [(j.id, j.state) for j in d.changed] == [(1, JobState.QUEUED), (2, JobState.QUEUED)]
    assert sorted(d.engine.table.jobs) == [1, 2]
    assert set(d.book.history) == {"a", "k"}  # each active job's memory history loaded
    assert [e["kind"] for e in await store.events(1)] == ["submitted"]


async def test_a_running_job_no_keeper_holds_is_interrupted_and_queued(store: Store) -> None:
    gone = Attempt(1, 1, (0,), T0, "k", pid=4_000_000, pid_start=1.0)  # it ran; now gone
    await stored(store, running(1), attempts=(gone,))
    d = Daemon(store)
    await d.reconcile(Keepers(), Runner())
    job = await store.get_job(1)
    assert job is not None and job.state is JobState.QUEUED
    assert job.reason is FailureReason.INTERRUPTED and job.ordinary_used == 0
    [attempt] = await store.attempts(1)
    assert attempt.reason == "interrupted" and attempt.ended_at is not None
    events = await store.events(1)
    assert events[-1]["kind"] == "interrupted"
    assert events[-1]["message"] == "the daemon stopped while this attempt ran"
    assert d.engine.table.jobs[1].state is JobState.QUEUED


async def test_a_claim_no_keeper_ever_started_leaves_no_attempt_and_is_queued(
    store: Store,
) -> None:
    await stored(store, running(1), attempts=(Attempt(1, 1, (0,), T0, "k"),))
    d = Daemon(store)
    await d.reconcile(Keepers(), Runner())
    job = await store.get_job(1)
    assert job is not None and (job.state, job.attempts, job.reason) == (JobState.QUEUED, 0, None)
    assert await store.attempts(1) == []
    assert (await store.events(1))[-1]["kind"] == "requeued"


async def test_a_leftover_process_of_the_same_start_is_killed(
    store: Store, leftover: subprocess.Popen[bytes]
) -> None:
    start = psutil.Process(leftover.pid).create_time()
    a = Attempt(1, 1, (0,), T0, "k", pid=leftover.pid, pid_start=start)
    await stored(store, running(1), attempts=(a,))
    await Daemon(store).reconcile()
    assert leftover.wait(timeout=30) == -9
    assert (await store.events(1))[-1]["message"] == (
        "the daemon stopped while this attempt ran; its leftover processes were killed"
    )


async def test_a_pid_reused_by_another_process_is_left_alone(
    store: Store, leftover: subprocess.Popen[bytes]
) -> None:
    start = psutil.Process(leftover.pid).create_time()
    a = Attempt(1, 1, (0,), T0, "k", pid=leftover.pid, pid_start=start - 60)
    await stored(store, running(1), attempts=(a,))
    await Daemon(store).reconcile()
    assert leftover.poll() is None  # still running
    assert (await store.events(1))[-1]["message"] == "the daemon stopped while this attempt ran"


async def test_an_attempt_a_keeper_holds_is_taken_back(store: Store) -> None:
    await stored(store, running(1, gpus=(1,)), attempts=(Attempt(1, 1, (1,), T0, "k"),))
    kept = Kept(record(1, 1, pid=4321))
    runner = Runner()
    d = Daemon(store)
    await d.reconcile(Keepers(kept), runner)
    assert runner.adopted == [(1, 1, (1,), d.engine.table.live[1].seq, kept)]
    assert d.engine.table.live[1].attempt.pid == 4321
    assert d.engine.table.jobs[1].state is JobState.RUNNING
    assert kept.calls == []  # not acknowledged: its end is still to come
    job = await store.get_job(1)
    assert job is not None and job.state is JobState.RUNNING


async def test_a_lost_record_is_interrupted_and_forgotten(store: Store) -> None:
    await stored(store, running(1), attempts=(Attempt(1, 1, (0,), T0, "k", pid=4321),))
    lost = Kept(record(1, 1, pid=4321, lost=True, ended_at=9.0))
    runner = Runner()
    await Daemon(store).reconcile(Keepers(lost), runner)
    assert runner.adopted == []
    assert lost.calls == ["ack"]  # it already ended: nothing to kill
    job = await store.get_job(1)
    assert job is not None and job.state is JobState.QUEUED


async def test_records_no_open_attempt_wants_are_killed_then_forgotten(store: Store) -> None:
    await stored(store, Job(1, spec(), JobState.SUCCEEDED, T0, T0, T0))
    ended = Kept(record(1, 1, ended_at=9.0, exit_code=0))
    still_running = Kept(record(1, 2))
    await Daemon(store).reconcile(Keepers(ended, still_running), Runner())
    assert ended.calls == ["ack"]
    assert still_running.calls == ["kill 0.0", "wait", "ack"]


async def test_an_open_attempt_of_a_finished_job_is_closed(store: Store) -> None:
    await stored(
        store,
        Job(1, spec(), JobState.SUCCEEDED, T0, T0, T0, attempts=1),
        attempts=(Attempt(1, 1, (0,), T0, "k"),),
    )
    d = Daemon(store)
    await d.reconcile()
    [attempt] = await store.attempts(1)
    assert attempt.reason == "interrupted" and attempt.ended_at is not None
    job = await store.get_job(1)
    assert job is not None and job.state is JobState.SUCCEEDED  # its job is not touched
    assert d.changed == []


async def test_a_child_learns_how_its_ended_parents_ended(store: Store) -> None:
    await stored(
        store,
        Job(1, spec(), JobState.SUCCEEDED, T0, T0, T0),
        Job(2, spec(), JobState.FAILED, T0, T0, T0, reason=FailureReason.EXIT_NONZERO),
        Job(3, spec(after=(1,)), submitted_at=T0),
        Job(4, spec(after=(1, 2)), submitted_at=T0),
        Job(5, spec(after=(77,)), submitted_at=T0),  # a parent the store does not have
    )
    await Daemon(store).reconcile()
    states = {i: j.state for i, j in (await store.get_jobs([3, 4, 5])).items() if j}
    assert states == {3: JobState.QUEUED, 4: JobState.FAILED, 5: JobState.FAILED}
    four = await store.get_job(4)
    assert four is not None and four.reason is FailureReason.DEPENDENCY_FAILED


async def test_ids_continue_after_the_stored_ones(store: Store) -> None:
    await stored(store, Job(5, spec(), JobState.SUCCEEDED, T0, T0, T0))
    d = Daemon(store)
    await d.reconcile()
    out = await d.engine.do(SubmitJobs((spec(),)))
    assert submitted_ids(out) == [6]


async def test_every_attempt_keepers_hold_is_taken_back_with_its_figures(store: Store) -> None:
    await stored(
        store,
        running(1, spec=spec(mem_mb=2000, vram_mb=500)),
        running(2, gpus=(1,)),
        attempts=(Attempt(1, 1, (0,), T0, "k"), Attempt(2, 1, (1,), T0, "k")),
    )
    runner = Runner()
    d = Daemon(store)
    await d.reconcile(Keepers(Kept(record(1, 1, pid=11)), Kept(record(2, 1, pid=22))), runner)
    assert [(a[0], a[4].pid) for a in runner.adopted] == [(1, 11), (2, 22)]
    one, two = d.engine.table.live[1], d.engine.table.live[2]
    assert one.projection == Projection(2000, "declared", 0) and one.vram_reserved_mb == 500
    assert two.projection is None and two.vram_reserved_mb == 0


async def test_a_lost_record_s_pid_is_never_killed_by_number(
    store: Store, leftover: subprocess.Popen[bytes]
) -> None:
    """A keeper's record, even a lost one, is the keeper's: the pid the attempt stored may
    be another process's by now, and only a pid with no record is killed by number."""
    start = psutil.Process(leftover.pid).create_time()
    a = Attempt(1, 1, (0,), T0, "k", pid=leftover.pid, pid_start=start)
    await stored(store, running(1), attempts=(a,))
    lost = Kept(record(1, 1, pid=leftover.pid, lost=True, ended_at=9.0))
    await Daemon(store).reconcile(Keepers(lost), Runner())
    assert leftover.poll() is None
    assert (await store.events(1))[-1]["message"] == "the daemon stopped while this attempt ran"


async def test_a_running_job_without_an_open_attempt_is_queued_again(store: Store) -> None:
    await stored(store, running(1))
    await Daemon(store).reconcile(Keepers(Kept(record(1, 1))), Runner())
    job = await store.get_job(1)
    assert job is not None and job.state is JobState.QUEUED
    assert job.reason is FailureReason.INTERRUPTED


async def test_a_child_of_an_active_parent_keeps_waiting(store: Store) -> None:
    await stored(store, Job(1, spec(), submitted_at=T0), Job(2, spec(after=(1,)), submitted_at=T0))
    d = Daemon(store)
    await d.reconcile()
    assert {i: j.state for i, j in d.engine.table.jobs.items()} == {
        1: JobState.QUEUED,
        2: JobState.QUEUED,
    }


async def test_a_keeper_that_fails_a_kill_does_not_stop_the_others(store: Store) -> None:
    await stored(store, Job(1, spec(), JobState.SUCCEEDED, T0, T0, T0))
    gone = Kept(record(1, 1), fails=KeeperGone("its keeper died"))
    refused = Kept(record(1, 2), fails=KeeperError("not_found", "no such record"))
    last = Kept(record(1, 3))
    await Daemon(store).reconcile(Keepers(gone, refused, last), Runner())
    assert gone.calls == ["kill 0.0"] and refused.calls == ["kill 0.0"]
    assert last.calls == ["kill 0.0", "wait", "ack"]
