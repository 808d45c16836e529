"""All the box's real cards behind one backend, numbered by PCI bus id across vendors."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from supervisor.gpus.base import (
    UNKNOWN_BUS_ID,
    GpuBackend,
    GpuError,
    GpuInfo,
    Vendor,
    bus_id_key,
)
from supervisor.gpus.visibility import visibility_env


@dataclasses.dataclass(frozen=True)
class _Route:
    backend: GpuBackend
    backend_index: int


class CompositeBackend:
    """Delegates each card to the backend that found it; with no backends, a box without GPUs."""

    def __init__(self, backends: Sequence[GpuBackend]) -> None:
        self._backends = list(backends)
        self._lock = threading.Lock()
        self._routes: list[_Route] | None = None
        self._vendors: frozenset[Vendor] = frozenset()

    @property
    def backends(self) -> list[GpuBackend]:
        return list(self._backends)

    def card_count(self) -> int:
        return sum(b.card_count() for b in self._backends)

    def discover(self) -> list[GpuInfo]:
        keyed: list[tuple[tuple[int, int, int, int], int, GpuInfo, GpuBackend]] = []
        for b in self._backends:
            # A card whose bus id is unknown (lost before it said) sorts right after the
            # card before it in its own backend, so that its vendor's numbering holds.
            key = bus_id_key(UNKNOWN_BUS_ID)
            for info in b.discover():
                if info.pci_bus_id != UNKNOWN_BUS_ID:
                    key = bus_id_key(info.pci_bus_id)
                keyed.append((key, len(keyed), info, b))
        keyed.sort(key=lambda entry: (entry[0], entry[1]))
        found = [(info, b) for _, _, info, b in keyed]
        with self._lock:
            self._routes = [_Route(b, info.index) for info, b in found]
            self._vendors = frozenset(info.vendor for info, _ in found)
        return [dataclasses.replace(info, index=i) for i, (info, _) in enumerate(found)]

    def query(self, index: int) -> GpuInfo:
        route = self._route(index)
        return dataclasses.replace(route.backend.query(route.backend_index), index=index)

    def process_vram_mb(self, index: int) -> dict[int, int]:
        route = self._route(index)
        return route.backend.process_vram_mb(route.backend_index)

    def visibility_env(self, cards: Sequence[GpuInfo]) -> dict[str, str]:
        self._discovered()
        return visibility_env(cards, self._vendors)

    def close(self) -> None:
        for b in self._backends:
            b.close()

    def reopen(self) -> None:
        for b in self._backends:
            b.reopen()

    def _route(self, index: int) -> _Route:
        routes = self._discovered()
        if not 0 <= index < len(routes):
            raise GpuError(f"no GPU {index} (there are {len(routes)})")
        return routes[index]

    def _discovered(self) -> list[_Route]:
        with self._lock:
            routes = self._routes
        if routes is None:
            self.discover()
            return self._discovered()
        return routes
