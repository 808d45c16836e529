"""What about the cards makes `gpusv health` fail: pure, over the monitor's readings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from supervisor.gpus.base import GpuInfo


def card_problems(cards: Sequence[GpuInfo], lost_why: Mapping[int, str]) -> list[str]:
    problems = []
    for c in cards:
        where = c.pci_bus_id or "bus id unknown"
        if c.health != "ok":
            why = lost_why.get(c.index, "")
            problems.append(f"GPU {c.index} ({where}) is lost" + (f": {why}" if why else ""))
        elif c.mig:
            problems.append(
                f"GPU {c.index} ({where}) is in MIG mode: gpusv does not schedule MIG "
                "instances and places no job on it (disable MIG, or leave the card out "
                "with CUDA_VISIBLE_DEVICES in gpusvd's environment)"
            )
    return problems


def placeable(card: GpuInfo) -> bool:
    """Whether a job may be placed on the card as it reads now."""
    return card.health == "ok" and not card.mig
