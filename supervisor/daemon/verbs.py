"""The everyday verbs: restart, hold, release, pause, resume, clean, cancel --all, and
`run` jobs tied to their client's connection.

The decisions are pure functions (`hold_refusal`, `cleanable`); the handlers carry them
out on the scheduler and the store.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

from supervisor.core.jobs import Job, JobState
from supervisor.daemon import joblogs, jobrows
from supervisor.daemon.clock import now_iso
from supervisor.daemon.store import Event
from supervisor.wire import protocol
from supervisor.wire.protocol import Clean, JobRef, ProtocolError

if TYPE_CHECKING:
    from supervisor.daemon.api import Api
    from supervisor.daemon.server import Peer

PAUSED_FILE = "paused"  # in the state dir: a pause outlives a restart of the daemon


def hold_refusal(job: Job, hold: bool) -> str | None:
    """Why `hold` (or `release`) does not apply to this job, or None."""
    if job.state is not JobState.QUEUED:
        return f"is {job.state.value}; only a queued job can be {'held' if hold else 'released'}"
    if job.held == hold:
        return "is already held" if hold else "is not held"
    return None


def held_note(job_id: int) -> str:
    return f"held (gpusv release {job_id})"


class Verbs:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.sched = api.sched
        self.store = api.store
        self.bound: dict[int, set[int]] = {}  # connection -> its `run` jobs

    # ---- restart, hold, release -------------------------------------------------------

    async def _each(self, req: JobRef, peer: Peer, act: Any) -> dict[str, Any]:
        """Every id checked for permission first (all or nothing), then acted on alone."""
        for job_id in req.ids:
            job = self.sched.jobs.get(job_id) or await self.store.get_job(job_id)
            if job is not None and not self.api.may_act(peer, job):
                raise protocol.ProtocolError(
                    protocol.FORBIDDEN, f"not allowed: {req.type} job {job_id}"
                )
        results = []
        for job_id in req.ids:
            try:
                results.append({"id": job_id, "ok": True, **await act(await self.api.job(job_id))})
            except ProtocolError as exc:
                results.append({"id": job_id, "ok": False, "error": exc.message})
        return {"ok": True, "results": results}

    async def restart(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        async def act(job: Job) -> dict[str, Any]:
            if not job.state.terminal:
                raise ProtocolError(protocol.INVALID_STATE, f"is still {job.state.value}")
            await self.api.check_after(job.spec.after)
            new = await self.api.enqueue([job.spec], job.spec.owner_uid)
            return {"new_id": new[0].id}

        return await self._each(req, peer, act)

    async def hold(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        hold = req.type == "hold"

        async def act(job: Job) -> dict[str, Any]:
            job = self.sched.jobs.get(job.id, job)
            why = hold_refusal(job, hold)
            if why is not None:
                raise ProtocolError(protocol.INVALID_STATE, why)
            note = held_note(job.id) if hold else None
            changed = dataclasses.replace(job, held=hold, waiting_for=note, hold_reason=None)
            kind = "held" if hold else "released"
            await self.store.save(changed, now_iso(), Event(kind, f"{kind} by uid {peer.uid}"))
            current = self.sched.jobs.get(job.id)
            if current is None or current.state is not JobState.QUEUED:
                return {"state": "gone"}  # cancelled meanwhile: its own record stands
            self.sched.put(dataclasses.replace(current, held=hold, waiting_for=note))
            if not hold and job.id in self.sched.pending_deps:
                self.sched._show_deps(job.id)
            return {"held": hold}

        return await self._each(req, peer, act)

    # ---- pause, resume ----------------------------------------------------------------

    async def pause(self, peer: Peer, paused: bool) -> dict[str, Any]:
        if peer.uid != os.geteuid() and not self.api.is_admin(peer.uid):
            raise ProtocolError(protocol.FORBIDDEN, "not allowed: only admins pause the queue")
        marker = self.api.cfg.state_dir / PAUSED_FILE
        if paused:
            marker.write_text(f"paused by uid {peer.uid} at {now_iso()}\n")
        else:
            marker.unlink(missing_ok=True)
        self.sched.paused = paused
        self.sched.poke()
        await self.store.add_daemon_event(now_iso(), "pause" if paused else "resume", {})
        return {"ok": True, "paused": paused}

    # ---- cancel --all, clean --------------------------------------------------------

    def own_active(self, peer: Peer) -> tuple[int, ...]:
        return tuple(sorted(j.id for j in self.sched.jobs.values() if j.spec.owner_uid == peer.uid))

    async def clean(self, req: Clean, peer: Peer) -> dict[str, Any]:
        owner = None if self.api.is_admin(peer.uid) else peer.uid
        cutoff = time.time() - req.older_than_s
        ids = await jobrows.clean(self.store, owner, cutoff, now_iso())
        freed = joblogs.remove(self.api.logs_dir, ids)
        return {"ok": True, "removed": ids, "freed_mb": -(-freed // (1 << 20))}

    # ---- run: a job tied to its client's connection ----------------------------------

    def bind(self, peer: Peer, job_id: int) -> None:
        self.bound.setdefault(peer.conn, set()).add(job_id)

    def connection_closed(self, peer: Peer) -> None:
        """The client of `run` jobs went away: cancel what is left of them. Not while
        draining: then the daemon, not the client, is going away."""
        ids = self.bound.pop(peer.conn, set())
        active = [i for i in sorted(ids) if i in self.sched.jobs]
        if active and not self.sched.draining and self.sched.tg is not None:
            self.sched.tg.start_soon(self._cancel, active)

    async def _cancel(self, ids: list[int]) -> None:
        for job_id in ids:
            await self.api.cancel_one(job_id, "its `gpusv run` client went away")
