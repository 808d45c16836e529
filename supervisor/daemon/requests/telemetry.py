"""The operators' read-only requests: gpus, stats, health, metrics and top, and the
snapshot behind the Prometheus metrics. Each handler gathers facts from the running
parts; none changes state."""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from supervisor.core import admission
from supervisor.core.jobs import Job, JobState
from supervisor.core.table import waiting_ahead
from supervisor.daemon.clock import epoch_from_iso
from supervisor.daemon.requests.server import Peer
from supervisor.daemon.store import output_files as joblogs
from supervisor.daemon.watch.metrics import Metrics
from supervisor.daemon.watch.metrics_snapshot import CardSample, HostSample, Snapshot
from supervisor.gpus.health import card_problems

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from supervisor.daemon.config import Config
    from supervisor.daemon.dispatcher import Dispatcher
    from supervisor.daemon.engine import Engine
    from supervisor.daemon.liveness import HealthBoard
    from supervisor.daemon.requests.access import Access
    from supervisor.daemon.running.runner import Runner
    from supervisor.daemon.store.database import Store
    from supervisor.daemon.watch.gpu_monitor import GpuMonitor

DEADMAN_RECENT_S = 600.0  # a deadman exit this recent keeps `health` failing
TOP_HELD = 50  # held jobs listed by `top`
TOP_HANGS = 10  # recent hang records listed by `top`


async def _counts(store: Store, column: str) -> dict[str, int]:
    return {str(k[0]): n for k, n in (await store.hang_counts(column)).items()}


def last_beats(board: HealthBoard) -> dict[str, float | None]:
    """Each watched service's last check-in (monotonic), None before its first.

    HealthBoard answers only "who is stale"; the metric needs the stamps themselves."""
    return board.last_beats()


class Telemetry:
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        dispatcher: Dispatcher,
        runner: Runner,
        monitor: GpuMonitor,
        board: HealthBoard,
        access: Access,
    ) -> None:
        self.cfg = cfg
        self.store: Store = engine.store
        self.listener_errors = engine.broker.failures  # counted as they happen
        self.table = engine.table
        self.dispatcher = dispatcher
        self.runner = runner
        self.monitor = monitor
        self.board = board
        self.started = time.monotonic()
        self.metrics = Metrics()
        # Whose job text (name, argv) a peer may see.
        self.may_see: Callable[[Peer, Job], bool] = access.may_act
        self.may_see_uid: Callable[[Peer, int], bool] = access.may_see_uid

    def handlers(self) -> dict[str, Callable[[Peer], Awaitable[dict[str, Any]]]]:
        return {
            "gpus": self.gpus,
            "stats": self.stats,
            "health": self.health,
            "metrics": self.prometheus,
            "top": self.top,
        }

    def _running_by_card(self) -> dict[int, list[int]]:
        running: dict[int, list[int]] = {}
        for job_id, r in self.table.live.items():
            if waiting_ahead(r, self.table.live):  # its card is not its own yet
                continue
            for c in r.cards:
                running.setdefault(c, []).append(job_id)
        return running

    def _pinned_by_card(self) -> dict[int, list[int]]:
        """The queued jobs that may run only on some cards, under each of those cards."""
        pinned: dict[int, list[int]] = {}
        for job in self.table.jobs.values():
            if job.state is JobState.QUEUED and job.spec.cards is not None:
                for c in job.spec.cards:
                    pinned.setdefault(c, []).append(job.id)
        return pinned

    async def gpus_json(self) -> list[dict[str, Any]]:
        hangs = {k[0]: n for k, n in (await self.store.hang_counts("gpu")).items()}
        running, pinned = self._running_by_card(), self._pinned_by_card()
        return [
            {
                "index": c.index,
                "uuid": c.uuid,
                "name": c.name,
                "vendor": c.vendor,
                "pci_bus_id": c.pci_bus_id,
                "vram_total_mb": c.vram_total_mb,
                "vram_used_mb": c.vram_used_mb,
                "utilization_pct": c.utilization_pct,
                "driver_version": c.driver_version,
                "health": c.health,
                # its keeper: "ok", "not answering" (no new job starts on the card), or
                # null while none is started
                "keeper": self.runner.keepers.state(f"gpu{c.index}"),
                "mig": c.mig,
                "allocation": self.monitor.allocation,
                "running_jobs": sorted(running.get(c.index, [])),
                "pinned_jobs": sorted(pinned.get(c.index, [])),
                "gpu_hangs": hangs.get(c.index, 0),
            }
            for c in self.monitor.cards
        ]

    async def gpus(self, _peer: Peer) -> dict[str, Any]:
        return {"ok": True, "gpus": await self.gpus_json()}

    async def stats_json(self) -> dict[str, Any]:
        store = self.store
        hangs = await store.hangs(1000)
        jobs = {s.value: 0 for s in JobState}
        jobs.update(await store.count_by("state"))
        return {
            "jobs": jobs,
            "failures": await store.attempt_failures(),
            "jobs_failed_by_reason": await store.count_by("reason"),
            "gpu_hangs": hangs,
            "gpu_hangs_by_card": await _counts(store, "gpu"),
            "gpu_hangs_by_driver": await _counts(store, "driver_version"),
            "gpu_hangs_by_job": await _counts(store, "job_id"),
            "held": self.table.held_counts(),
            "deadman_fires": len(await store.daemon_events("deadman")),
            "logs": await joblogs.disk_use(joblogs.logs_dir(self.cfg.state_dir)),
        }

    async def stats(self, peer: Peer) -> dict[str, Any]:
        stats = await self.stats_json()
        stats["gpu_hangs"] = await self.visible_hangs(stats["gpu_hangs"], peer)
        return {"ok": True, **stats}

    async def visible_hangs(self, hangs: list[dict[str, Any]], peer: Peer) -> list[dict[str, Any]]:
        """A hang is a fact about the machine; its labels and evidence are the job's own."""
        owners = await self.store.owners({h["job"] for h in hangs if h["job"]})
        out = []
        for h in hangs:
            uid = owners.get(h["job"])
            if uid is None or not self.may_see_uid(peer, uid):
                h = {**h, "labels": {}, "evidence": None, "name": None, "frame": None}
            out.append(h)
        return out

    async def problems(self) -> list[str]:
        problems = card_problems(self.monitor.cards, self.monitor.lost_why)
        if self.store.problem is not None:
            problems.append(f"{self.store.problem}; no job starts until it can")
        if self.dispatcher.draining:
            problems.append("gpusvd is draining (stopping)")
        problems += self.runner.keepers.problems(time.monotonic())
        stale = self.board.stale(time.monotonic())
        if stale:
            problems.append(f"services not checking in: {', '.join(stale)}")
        fires = await self.store.daemon_events("deadman")
        if fires:
            age = time.time() - epoch_from_iso(fires[-1]["at"])
            if age < DEADMAN_RECENT_S:
                problems.append(f"the deadman restarted gpusvd {age:.0f}s ago")
        return problems

    async def health(self, _peer: Peer) -> dict[str, Any]:
        problems = await self.problems()
        health = {"ok": not problems, "problems": problems, "paused": self.dispatcher.paused}
        return {"ok": True, "health": health}

    # ---- metrics ------------------------------------------------------------------------

    def host_sample(self) -> HostSample:
        host, running = self.dispatcher.host(), self.dispatcher.running_use()
        return HostSample(
            limit_mb=host.limit_mb,
            available_mb=host.available_mb,
            reserve_mb=host.reserve_mb,
            projected_mb=sum(
                j.rss_mb if j.projected_mb is None else j.projected_mb for j in running
            ),
            rss_mb=sum(j.rss_mb for j in running),
            free_for_new_mb=admission.free_for_new_mb(host, running),
        )

    async def metrics_snapshot(self) -> Snapshot:
        store, table = self.store, self.table
        running = self._running_by_card()
        counted = await store.hang_counts("gpu", "pci_bus_id", "driver_version")
        hangs = {(str(g), bus or "", drv or ""): n for (g, bus, drv), n in counted.items()}
        cards = tuple(
            CardSample(
                index=c.index,
                pci_bus_id=c.pci_bus_id,
                name=c.name,
                vendor=c.vendor,
                driver_version=c.driver_version,
                utilization_pct=c.utilization_pct,
                vram_used_mb=c.vram_used_mb,
                vram_total_mb=c.vram_total_mb,
                healthy=c.health == "ok",
                running_jobs=len(running.get(c.index, [])),
                uuid=c.uuid,
            )
            for c in self.monitor.cards
        )
        return Snapshot(
            jobs=await store.count_by("state"),
            held={**table.held_counts(), "dependency": len(table.pending)},
            attempt_failures=await store.attempt_failures(),
            hangs=dict(hangs),
            cards=cards,
            host=self.host_sample(),
            beats=last_beats(self.board),
            deadman_fires=len(await store.daemon_events("deadman")),
            problems=len(await self.problems()),
            draining=self.dispatcher.draining,
            storage_ok=store.problem is None,
            storage_failures=store.failures,
            listener_errors=self.listener_errors.total(),
        )

    async def prometheus(self, _peer: Peer) -> dict[str, Any]:
        return {"ok": True, "text": self.metrics.render(await self.metrics_snapshot())}

    async def serve_metrics(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listen = self.cfg.metrics_listen
        await self.metrics.serve(listen, self.metrics_snapshot, task_status=task_status)

    # ---- top ----------------------------------------------------------------------------

    def _running_json(self, peer: Peer) -> list[dict[str, Any]]:
        out = []
        for job_id, r in self.table.live.items():
            job = self.table.jobs.get(job_id)
            visible = job is not None and self.may_see(peer, job)
            p = self.runner.procs.get(job_id)
            out.append(
                {
                    "id": job_id,
                    "name": job.spec.name if job and visible else "",
                    "argv": list(job.spec.argv) if job and visible else [],
                    "gpus": list(r.cards),
                    "attempt": r.attempt.n,
                    "runtime_s": round(time.monotonic() - r.claimed_mono, 1),
                    "rss_mb": p.rss_mb if p else 0,
                    "peak_rss_mb": p.peak_rss_mb if p else 0,
                    "projected_mb": r.projection.projected_mb if r.projection else None,
                    "progress": job.progress if job and visible else None,
                }
            )
        return sorted(out, key=lambda j: j["id"])

    async def top(self, peer: Peer) -> dict[str, Any]:
        queued = [j for j in self.table.jobs.values() if j.state is JobState.QUEUED]
        held = [
            {
                "id": j.id,
                "name": j.spec.name if self.may_see(peer, j) else "",
                "waiting_for": j.waiting_for,
            }
            for j in itertools.islice((j for j in queued if j.waiting_for), TOP_HELD)
        ]
        return {
            "ok": True,
            "gpus": await self.gpus_json(),
            "running": self._running_json(peer),
            "held": held,
            "queued": len(queued),
            "paused": self.dispatcher.paused,
            "recent_hangs": await self.visible_hangs(await self.store.hangs(TOP_HANGS), peer),
            "host_memory": dataclasses.asdict(self.host_sample()),
            "problems": await self.problems(),
            "draining": self.dispatcher.draining,
        }
