"""The memory history of each key, cached from the store, and the figures made from it."""

from __future__ import annotations

from supervisor.core.commands import AttemptEnded
from supervisor.core.jobs import JobSpec
from supervisor.core.projection import MemObservation, Projection, project
from supervisor.daemon.broker import Broker
from supervisor.daemon.store.database import Store

HISTORY = 50  # attempts per memory key kept in memory for projections


class MemoryBook:
    def __init__(self, store: Store, broker: Broker, margin: float) -> None:
        self.store = store
        self.margin = margin
        self.history: dict[str, list[MemObservation]] = {}
        # project() is pure: its figure holds until the key's history changes.
        self._projections: dict[str, dict[tuple[int | None, float | None], Projection | None]] = {}
        broker.subscribe(AttemptEnded, self._ended)

    async def load(self, key: str) -> None:
        if key not in self.history:
            rows = await self.store.mem_history(key, HISTORY)
            self.history[key] = [
                MemObservation(r.peak_rss_mb, r.reason, r.scale, r.peak_vram_mb) for r in rows
            ]
            self._forget(key)

    def _ended(self, ev: AttemptEnded) -> None:
        a = ev.attempt
        if a.peak_rss_mb:
            rows = self.history.setdefault(a.mem_key, [])
            rows.append(MemObservation(a.peak_rss_mb, a.reason, a.mem_scale, a.peak_vram_mb))
            del rows[:-HISTORY]
            self._forget(a.mem_key)

    def _forget(self, key: str) -> None:
        self._projections.pop(key, None)

    def projection(self, spec: JobSpec) -> Projection | None:
        known = self._projections.setdefault(spec.mem_key, {})
        figure = (spec.mem_mb, spec.mem_scale)
        if figure not in known:
            known[figure] = project(
                self.history.get(spec.mem_key, []),
                declared_mb=spec.mem_mb,
                scale=spec.mem_scale,
                margin=self.margin,
            )
        return known[figure]

    def vram_need(self, spec: JobSpec) -> int | None:
        if spec.vram_mb is not None:
            return spec.vram_mb
        peaks = [o.peak_vram_mb for o in self.history.get(spec.mem_key, []) if o.peak_vram_mb]
        return max(peaks[-10:]) if peaks else None
