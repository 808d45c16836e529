"""The kernel-log watcher's decisions, fed real kernel lines (from the corpus, with the
bus id of a simulated card): which card a line is about, which running jobs it kills,
which failed exits it turns into hangs, and which evidence an attempt's end finds.
The engine, its store and the GPU monitor are real; the watcher's commands are read
where it queues them for the engine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from supervisor.core.commands import AttemptEnded, HangSeen, Reclassify
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.records import Attempt
from supervisor.core.table import Live, Phase
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import Config
from supervisor.daemon.engine import Engine
from supervisor.daemon.store.database import Store
from supervisor.daemon.watch.gpu_monitor import GpuMonitor
from supervisor.daemon.watch.hangs import HangWatcher
from supervisor.faults.classifier import Classifier
from supervisor.faults.sources import KernelLine
from supervisor.gpus.simulated import SimulatedBackend, parse_spec

AT = 1767322800.0  # the line's stamp: 2026-01-02T03:00:00.000Z
# Card 1 of the simulated machine is 0000:02:00.0.
HANG_1 = (
    "NVRM: Xid (PCI:0000:02:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
    "errorString CTX SWITCH TIMEOUT, Info 0x58005"
)
LOST_1 = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
HANG_NO_BUS = "NVRM: Xid: 109, errorString CTX SWITCH TIMEOUT"
EVIDENCE = {
    "source": "kernel_log",
    "lines": [HANG_1],
    "at": ["2026-01-02T03:00:00.000Z"],
    "class": "gpu_hang",
    "xid": 109,
}


async def watcher_on(store: Store, tmp_path: Path, cards: int) -> HangWatcher:
    async def call(fn: object, _name: str) -> object:
        return await anyio.to_thread.run_sync(fn)  # type: ignore[arg-type]

    monitor = GpuMonitor(SimulatedBackend(parse_spec(f"{cards}x8G"), tmp_path), call)
    await monitor.discover()
    broker = Broker()
    cfg = Config(state_dir=tmp_path, socket=tmp_path / "sock")
    return HangWatcher(cfg, Engine(store, broker), broker, monitor, mem_total_mb=16000)


@pytest.fixture
async def watcher(store: Store, tmp_path: Path) -> AsyncIterator[HangWatcher]:
    yield await watcher_on(store, tmp_path, 2)


def attempt(job_id: int, cards: tuple[int, ...], reason: str | None = None) -> Attempt:
    return Attempt(job_id, 1, cards, "t", "k", ended_at="t" if reason else None, reason=reason)


def run_on(
    w: HangWatcher, job_id: int, cards: tuple[int, ...], kill: FailureReason | None = None
) -> None:
    w.engine.table.live[job_id] = Live(attempt(job_id, cards), cards, job_id, Phase.RUNNING,
                                       None, 0, 0.0, kill=kill)  # fmt: skip


def ended(w: HangWatcher, job_id: int, cards: tuple[int, ...], reason: str) -> None:
    job = Job(job_id, JobSpec(("x",), "/", {}, 1, 1), JobState.QUEUED)
    w.engine.broker.publish(AttemptEnded(job, attempt(job_id, cards, reason), cards))


def test_a_line_is_about_the_card_its_bus_id_names(watcher: HangWatcher) -> None:
    c = Classifier()
    assert watcher.card_for(c.feed(HANG_1)) == 1
    assert watcher.card_for(c.feed(HANG_1.replace("0000:02:00", "0000:09:00"))) is None
    # A line naming no bus: by the device the kernel filed it under, else unknown with two
    # cards.
    assert watcher.card_for(c.feed(HANG_NO_BUS), "0000:01:00.0") == 0
    assert watcher.card_for(c.feed(HANG_NO_BUS)) is None


async def test_a_line_naming_no_card_is_the_only_card_s(store: Store, tmp_path: Path) -> None:
    w = await watcher_on(store, tmp_path, 1)
    assert w.card_for(Classifier().feed(HANG_NO_BUS)) == 0


def test_a_hang_line_kills_the_jobs_running_on_its_card(watcher: HangWatcher) -> None:
    run_on(watcher, 1, (1,))
    run_on(watcher, 2, (0,))
    run_on(watcher, 3, (0, 1))
    run_on(watcher, 4, (1,), kill=FailureReason.GPU_HANG)  # already being killed for one
    run_on(watcher, 5, (1,), kill=FailureReason.CANCELLED)
    watcher.on_line(KernelLine(HANG_1, AT))
    assert [(c.job_id, c.card) for c in watcher.commands if isinstance(c, HangSeen)] == [
        (1, 1),
        (3, 1),
        (5, 1),
    ]
    first = watcher.commands[0]
    assert isinstance(first, HangSeen) and first.evidence == EVIDENCE
    machine = first.machine
    assert (machine["gpu"], machine["at"], machine["pci_bus_id"]) == (
        1, "2026-01-02T03:00:00.000Z", "0000:02:00.0",
    )  # fmt: skip
    assert isinstance(machine["host_mem_available_mb"], int)
    assert watcher.recent() == [HANG_1]


def test_other_lines_are_kept_but_decide_nothing(watcher: HangWatcher) -> None:
    run_on(watcher, 1, (1,))
    watcher.on_line(KernelLine("usb 1-1: new high-speed USB device number 2", AT))
    watcher.on_line(KernelLine(HANG_1.replace("0000:02:00", "0000:09:00"), AT))  # no such card
    assert watcher.commands == [] and len(watcher.faults) == 0
    assert len(watcher.recent()) == 2


def test_a_failed_exit_before_its_card_s_reset_line_is_reclassified(
    watcher: HangWatcher,
) -> None:
    ended(watcher, 1, (1,), "exit_nonzero")
    ended(watcher, 2, (1,), "signal")
    ended(watcher, 3, (0,), "exit_nonzero")  # another card
    ended(watcher, 4, (1,), "oom_killed")  # not a failure a reset explains
    ended(watcher, 5, (), "exit_nonzero")  # no card at all
    watcher.on_line(KernelLine(HANG_1, AT))
    told = [c for c in watcher.commands if isinstance(c, Reclassify)]
    assert [(c.job_id, c.attempt.reason) for c in told] == [(1, "exit_nonzero"), (2, "signal")]
    assert told[0].evidence == EVIDENCE
    watcher.commands.clear()
    watcher.on_line(KernelLine(HANG_1, AT + 1))  # each exit is reclassified once
    assert [c for c in watcher.commands if isinstance(c, Reclassify)] == []


def test_an_exit_longer_ago_than_the_window_stays_as_it_was(watcher: HangWatcher) -> None:
    window = watcher.window_s
    watcher.failures.append((time.monotonic() - window - 5, 1, attempt(1, (1,), "signal"), (1,)))
    watcher.failures.append((time.monotonic() - window + 5, 2, attempt(2, (1,), "signal"), (1,)))
    watcher.on_line(KernelLine(HANG_1, AT))
    assert [c.job_id for c in watcher.commands if isinstance(c, Reclassify)] == [2]


def test_an_end_finds_the_evidence_of_its_own_cards_since_it_began(watcher: HangWatcher) -> None:
    before = time.monotonic()
    watcher.on_line(KernelLine(HANG_1, AT))
    assert watcher.hang_evidence((1,), before) == EVIDENCE
    assert watcher.hang_evidence((0,), before) is None
    assert watcher.hang_evidence((0, 1), before) == EVIDENCE
    assert watcher.hang_evidence((1,), time.monotonic() + 1) is None  # a later attempt's


async def test_an_end_waits_for_a_reset_line_on_its_way(watcher: HangWatcher) -> None:
    since = time.monotonic()
    assert await watcher.wait_for_fault((), since) is None
    found: list[object] = []

    async def end() -> None:
        found.append(await watcher.wait_for_fault((1,), since))

    async with anyio.create_task_group() as tg:
        tg.start_soon(end)
        await anyio.wait_all_tasks_blocked()
        watcher.on_line(KernelLine(HANG_1, AT))
    assert found == [EVIDENCE]


def test_a_lost_card_is_taken_out(watcher: HangWatcher) -> None:
    watcher.on_line(KernelLine(LOST_1, AT))
    assert watcher.monitor.cards[1].health == "lost"
    assert watcher.monitor.lost_why == {1: LOST_1}
    assert watcher.monitor.cards[0].health == "ok"


def test_an_oom_kill_line_remembers_its_pid(watcher: HangWatcher) -> None:
    watcher.on_line(KernelLine("Out of memory: Killed process 4242 (python) total-vm:1kB", AT))
    assert set(watcher.oom_pids) == {4242}
