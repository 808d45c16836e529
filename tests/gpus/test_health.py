"""What the cards contribute to `health`, which cards take jobs, the start-up prober, and
letting go of the driver at exit."""

from __future__ import annotations

import dataclasses
import threading

import anyio
import pytest

from supervisor.gpus.base import GpuInfo, GpuLost
from supervisor.gpus.health import card_problems, placeable
from supervisor.gpus.probing import Pending, Prober
from supervisor.gpus.release import release_backend

CARD = GpuInfo(
    index=0,
    vendor="nvidia",
    vendor_index=0,
    name="NVIDIA A100",
    pci_bus_id="0000:01:00.0",
    vram_total_mb=81920,
    vram_used_mb=0,
    utilization_pct=None,
    driver_version="550.54.15",
    health="ok",
    uuid="GPU-0",
)


def test_a_mig_card_is_a_health_problem_and_takes_no_job() -> None:
    mig = dataclasses.replace(CARD, mig=True)
    (problem,) = card_problems([mig], {})
    assert "GPU 0 (0000:01:00.0) is in MIG mode" in problem
    assert not placeable(mig) and placeable(CARD)


def test_a_lost_card_names_why_even_without_a_bus_id() -> None:
    lost = dataclasses.replace(CARD, index=1, pci_bus_id="", health="lost")
    assert card_problems([CARD, lost], {1: "GPU is lost"}) == [
        "GPU 1 (bus id unknown) is lost: GPU is lost"
    ]
    assert not placeable(lost)


def test_the_prober_returns_answers_errors_and_pending_without_waiting_for_a_wedge() -> None:
    wedge = threading.Event()

    def read(i: int) -> int:
        if i == 1:
            raise GpuLost("gone")
        if i == 2:
            wedge.wait()
        return i * 10

    prober = Prober(deadline_s=0.2)
    out = prober.each(3, read)
    assert out[0] == 0 and isinstance(out[1], GpuLost) and isinstance(out[2], Pending)
    with pytest.raises(GpuLost, match="start-up probe"):
        prober.check(2, "card 2")
    again = prober.each(3, read)  # no second thread on the wedged card
    assert isinstance(again[2], Pending)
    wedge.set()
    for _ in range(200):
        try:
            prober.check(2, "card 2")
            break
        except GpuLost:
            threading.Event().wait(0.01)
    else:
        raise AssertionError("the probe's return was not noticed")


async def test_release_gives_up_on_a_driver_that_never_lets_go() -> None:
    stuck = threading.Event()

    class Wedged:
        closed = False

        def close(self) -> None:
            stuck.wait()
            self.closed = True

    backend = Wedged()
    with anyio.fail_after(10):
        await release_backend(backend, deadline_s=0.1)  # type: ignore[arg-type]
    assert not backend.closed
    stuck.set()
