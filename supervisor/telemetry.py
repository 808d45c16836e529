"""The operators' read-only requests: gpus, stats, health (and, through metrics.py,
Prometheus text). Each handler gathers facts from the running parts; none changes state."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from .clock import epoch_from_iso
from .jobs import JobState
from .server import Peer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .daemon import Parts

DEADMAN_RECENT_S = 600.0  # a deadman exit this recent keeps `health` failing


class Telemetry:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.started = time.monotonic()

    def handlers(self) -> dict[str, Callable[[Peer], Awaitable[dict[str, Any]]]]:
        return {
            "gpus": self.gpus,
            "stats": self.stats,
            "health": self.health,
            "top": self.top,
        }

    async def gpus_json(self) -> list[dict[str, Any]]:
        sched = self.parts.sched
        hangs = Counter(h["gpu"] for h in await self.parts.store.hangs(100_000))
        running: dict[int, list[int]] = {}
        for r in sched.running.values():
            for c in r.cards:
                running.setdefault(c, []).append(r.job_id)
        return [
            {
                "index": c.index,
                "name": c.name,
                "vendor": c.vendor,
                "pci_bus_id": c.pci_bus_id,
                "vram_total_mb": c.vram_total_mb,
                "vram_used_mb": c.vram_used_mb,
                "utilization_pct": c.utilization_pct,
                "driver_version": c.driver_version,
                "health": c.health,
                "running_jobs": sorted(running.get(c.index, [])),
                "gpu_hangs": hangs.get(c.index, 0),
            }
            for c in self.parts.monitor.cards
        ]

    async def gpus(self, _peer: Peer) -> dict[str, Any]:
        return {"ok": True, "gpus": await self.gpus_json()}

    async def stats_json(self) -> dict[str, Any]:
        store = self.parts.store
        hangs = await store.hangs(1000)
        jobs = {s.value: 0 for s in JobState}
        jobs.update(await store.count_by("state"))
        return {
            "jobs": jobs,
            "failures": await store.attempt_failures(),
            "jobs_failed_by_reason": await store.count_by("reason"),
            "gpu_hangs": hangs,
            "gpu_hangs_by_card": dict(Counter(str(h["gpu"]) for h in hangs)),
            "gpu_hangs_by_driver": dict(Counter(str(h["driver_version"]) for h in hangs)),
            "gpu_hangs_by_job": dict(Counter(str(h["job"]) for h in hangs)),
            "held": self.parts.sched.held_counts(),
            "deadman_fires": len(await store.daemon_events("deadman")),
        }

    async def stats(self, _peer: Peer) -> dict[str, Any]:
        return {"ok": True, **(await self.stats_json())}

    async def problems(self) -> list[str]:
        parts = self.parts
        problems = []
        for c in parts.monitor.cards:
            if c.health != "ok":
                why = parts.monitor.lost_why.get(c.index, "")
                problems.append(
                    f"GPU {c.index} ({c.pci_bus_id}) is lost" + (f": {why}" if why else "")
                )
        if parts.sched.draining:
            problems.append("gpusvd is draining (stopping)")
        stale = parts.board.stale(time.monotonic())
        if stale:
            problems.append(f"services not checking in: {', '.join(stale)}")
        fires = await parts.store.daemon_events("deadman")
        if fires:
            age = time.time() - epoch_from_iso(fires[-1]["at"])
            if age < DEADMAN_RECENT_S:
                problems.append(f"the deadman restarted gpusvd {age:.0f}s ago")
        return problems

    async def health(self, _peer: Peer) -> dict[str, Any]:
        problems = await self.problems()
        return {"ok": True, "health": {"ok": not problems, "problems": problems}}

    async def top(self, _peer: Peer) -> dict[str, Any]:
        sched = self.parts.sched
        running = []
        for r in sched.running.values():
            job = sched.jobs.get(r.job_id)
            running.append(
                {
                    "id": r.job_id,
                    "name": job.spec.name if job else "",
                    "argv": list(job.spec.argv) if job else [],
                    "gpus": list(r.cards),
                    "runtime_s": round(time.monotonic() - r.started_mono, 1),
                    "rss_mb": r.rss_mb,
                    "peak_rss_mb": r.peak_rss_mb,
                    "progress": job.progress if job else None,
                }
            )
        held = [
            {"id": j.id, "name": j.spec.name, "waiting_for": j.waiting_for}
            for j in sched.jobs.values()
            if j.state is JobState.QUEUED and j.waiting_for
        ][:50]
        queued = sum(1 for j in sched.jobs.values() if j.state is JobState.QUEUED)
        hangs = (await self.parts.store.hangs(10))[-10:]
        return {
            "ok": True,
            "gpus": await self.gpus_json(),
            "running": running,
            "held": held,
            "queued": queued,
            "recent_hangs": hangs,
        }
