"""Admission at its edges: one wait keeps its reason, an array's cap counted start by
start, and a card of shared jobs with no VRAM left ends the scan."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.admission import (
    Candidate,
    Card,
    Hold,
    HostMemory,
    Plan,
    RunningJob,
    Start,
    plan,
)
from supervisor.core.projection import Projection

GB = 1024
CARD = 24 * GB
HOST = HostMemory(limit_mb=125 * GB, available_mb=120 * GB, reserve_mb=6 * GB)
NOW = 10_000.0


def run(
    candidates: Sequence[Candidate], cards: Sequence[Card], cpu: int, running: Sequence[RunningJob]
) -> Plan:
    return plan(
        candidates,
        cards=cards,
        cpu_slots_free=cpu,
        host=HOST,
        running=running,
        now=NOW,
        max_backfill_wait_s=900.0,
    )


# One card, taken by job 9, which is projected at 100 GB: 14 GB of host RAM left.
BUSY = [Card(0, CARD, 0, True, (9,))]
BIG = [RunningJob(9, 100 * GB, 0, (0,), 0)]


def test_a_job_held_for_ram_is_asked_about_ram_first() -> None:
    held = Candidate(1, 1, None, Projection(50 * GB, "observed", 1), NOW - 10, "host_ram")
    message = "waiting for host RAM: needs ~50 GiB, ~14 GiB free"
    assert run([held], BUSY, 1, BIG) == Plan((), (Hold(1, "host_ram", message),))


def test_a_job_held_for_a_device_is_asked_about_devices_first() -> None:
    held = Candidate(1, 1, None, Projection(50 * GB, "observed", 1), NOW - 10, "gpus")
    message = "waiting for 1 free GPU, 0 free"
    assert run([held], BUSY, 1, BIG) == Plan((), (Hold(1, "gpus", message),))


def test_an_array_s_cap_counts_each_start() -> None:
    cards = [Card(i, CARD, 0, True, ()) for i in range(4)]
    jobs = [Candidate(i, 1, None, None, None, array=1, cap=3) for i in (1, 2, 3, 4)]
    cap = "waiting for array 1: at most 3 of its jobs run at once"
    assert run(jobs, cards, 0, []) == Plan(
        (Start(1, (0,), 0), Start(2, (1,), 0), Start(3, (2,), 0)), (Hold(4, "array", cap),)
    )


def shared_card(free_mb: int) -> tuple[list[Card], list[RunningJob]]:
    """One card running only a shared job that booked all but `free_mb` of it."""
    return [Card(0, CARD, 0, True, (9,))], [
        RunningJob(9, None, 0, (0,), CARD - free_mb, shared=True)
    ]


def test_a_shared_card_with_no_vram_left_ends_the_scan() -> None:
    cards, running = shared_card(0)
    assert run([Candidate(1, 1, None, None, None)], cards, 0, running) == Plan((), ())


def test_a_shared_card_with_vram_left_keeps_the_scan_going() -> None:
    cards, running = shared_card(1)
    out = run([Candidate(1, 1, None, None, None)], cards, 0, running)
    assert out.starts == () and [(h.job_id, h.reason) for h in out.holds] == [(1, "gpus")]


def test_a_job_held_for_ram_starts_once_its_ram_fits() -> None:
    held = Candidate(1, 1, None, Projection(10 * GB, "observed", 1), NOW - 10, "host_ram")
    idle = [Card(0, CARD, 0, True, ())]
    assert run([held], idle, 0, []) == Plan((Start(1, (0,), 0),), ())
