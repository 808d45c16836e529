"""The cards gpusvd was given: a visibility variable in its own environment.

Inside a Slurm job or a Kubernetes pod, `CUDA_VISIBLE_DEVICES` / `ROCR_VISIBLE_DEVICES`
name the cards granted to the allocation, while NVML and sysfs still list every card of
the host. gpusvd then manages only the granted ones, renumbered 0..N-1 in its own
numbering; each keeps its vendor index, so a job still gets the host-wide number CUDA
uses under `CUDA_DEVICE_ORDER=PCI_BUS_ID` (or its UUID).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from supervisor.gpus.base import GpuBackend, GpuError, GpuInfo
from supervisor.gpus.visibility import CUDA_FAMILY

ALLOCATION_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Allocation:
    variable: str
    tokens: tuple[str, ...]  # indices or UUIDs, as given

    def describe(self) -> str:
        return f"{self.variable}={','.join(self.tokens)}"


def allocation_from(env: Mapping[str, str]) -> list[Allocation]:
    """The visibility variables set in `env`; an empty one grants no card of its vendor."""
    found = []
    for name in ALLOCATION_VARIABLES:
        if name in env:
            tokens = tuple(t.strip() for t in env[name].split(",") if t.strip())
            found.append(Allocation(name, tokens))
    return found


def granted(cards: Sequence[GpuInfo], allocations: Sequence[Allocation]) -> list[int]:
    """The indices of `cards` the allocations grant, in order. A vendor without a variable
    is not restricted. A token that matches no card is an error: the allocation and the
    host disagree, and guessing could take a card that belongs to another job."""
    if not allocations:
        return [c.index for c in cards]
    keep: set[int] = set()
    restricted: set[str] = set()
    for alloc in allocations:
        family = (
            [c for c in cards if c.vendor in CUDA_FAMILY]
            if alloc.variable == "CUDA_VISIBLE_DEVICES"
            else [c for c in cards if c.vendor == "amd"]
        )
        if not family:
            continue  # a variable for a vendor this host has no card of: nothing to keep
        restricted.update(c.vendor for c in family)
        for token in alloc.tokens:
            keep.add(_match(token, family, alloc).index)
    return [c.index for c in cards if c.index in keep or c.vendor not in restricted]


def _match(token: str, family: Sequence[GpuInfo], alloc: Allocation) -> GpuInfo:
    if token.isdigit():
        for card in family:
            if card.vendor_index == int(token):
                return card
    else:
        for card in family:
            # CUDA also takes a unique prefix of a UUID.
            if card.uuid and card.uuid.lower().startswith(token.lower()):
                return card
    raise GpuError(f"{alloc.describe()} in gpusvd's environment: no card {token!r} on this host")


class AllocatedBackend:
    """Only the granted cards of `inner`, numbered 0..N-1."""

    def __init__(self, inner: GpuBackend, allocations: Sequence[Allocation]) -> None:
        self._inner = inner
        self.allocations = list(allocations)
        self._map: list[int] | None = None
        self.host_count = 0

    @property
    def inner(self) -> GpuBackend:
        return self._inner

    def describe(self) -> str:
        return " ".join(a.describe() for a in self.allocations)

    def card_count(self) -> int:
        return len(self._mapped())

    def discover(self) -> list[GpuInfo]:
        cards = self._inner.discover()
        self._map = granted(cards, self.allocations)
        self.host_count = len(cards)
        return [dataclasses.replace(cards[j], index=i) for i, j in enumerate(self._map)]

    def query(self, index: int) -> GpuInfo:
        return dataclasses.replace(self._inner.query(self._host(index)), index=index)

    def process_vram_mb(self, index: int) -> dict[int, int]:
        return self._inner.process_vram_mb(self._host(index))

    def visibility_env(self, cards: Sequence[GpuInfo]) -> dict[str, str]:
        return self._inner.visibility_env(cards)

    def close(self) -> None:
        self._inner.close()

    def reopen(self) -> None:
        self._inner.reopen()

    def _mapped(self) -> list[int]:
        if self._map is None:
            self.discover()
        assert self._map is not None
        return self._map

    def _host(self, index: int) -> int:
        mapped = self._mapped()
        if not 0 <= index < len(mapped):
            raise GpuError(f"no GPU {index} (there are {len(mapped)})")
        return mapped[index]


def describe_allocation(backend: object) -> str | None:
    """ "CUDA_VISIBLE_DEVICES=1 in gpusvd's environment: 1 of 3 cards managed", or None."""
    if not isinstance(backend, AllocatedBackend):
        return None
    managed = backend.card_count()
    return (
        f"{backend.describe()} in gpusvd's environment: "
        f"{managed} of {backend.host_count} cards managed"
    )
