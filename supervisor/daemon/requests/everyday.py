"""The everyday verbs: restart, hold, release, update, pause, resume, clean, cancel
--all, and `run` jobs tied to their client's connection.

The job-state changes go through the engine (Submit, HoldJob, UpdateJob, Cancel); the
decision of whether a hold or an update applies is `hold_refusal` / `update_refusal`, pure.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from supervisor.core.commands import Cancel, Forget, HoldJob, UpdateJob
from supervisor.core.engine import hold_refusal
from supervisor.core.jobs import Job
from supervisor.core.update import update_refusal
from supervisor.daemon.clock import now_iso
from supervisor.daemon.requests.intake import find_job
from supervisor.daemon.store import job_queries as jobrows
from supervisor.daemon.store import output_files as joblogs
from supervisor.daemon.store.writer import StorageError, storage_reason
from supervisor.wire import protocol
from supervisor.wire.edits import Update
from supervisor.wire.protocol import Clean, JobRef, ProtocolError

if TYPE_CHECKING:
    from supervisor.daemon.dispatcher import Dispatcher
    from supervisor.daemon.engine import Engine
    from supervisor.daemon.requests.access import Access
    from supervisor.daemon.requests.intake import Intake
    from supervisor.daemon.requests.server import Peer

PAUSED_FILE = "paused"  # in the state dir: a pause outlives a restart of the daemon
CLOSE_CANCEL_S = 10.0  # the longest a closed `run` connection's cancels may take


class Verbs:
    def __init__(
        self,
        engine: Engine,
        access: Access,
        intake: Intake,
        dispatcher: Dispatcher,
        *,
        state_dir: Path,
        draining: Callable[[], bool],
    ) -> None:
        self.engine = engine
        self.table = engine.table
        self.store = engine.store
        self.access = access
        self.intake = intake
        self.dispatcher = dispatcher
        self.state_dir = state_dir
        self.logs_dir = joblogs.logs_dir(state_dir)
        self.draining = draining
        self.bound: dict[int, set[int]] = {}  # connection -> its `run` jobs

    async def _each(
        self,
        req: JobRef | Update,
        peer: Peer,
        act: Callable[[Job], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Every id checked for permission first (all or nothing), then acted on alone."""
        for job_id in req.ids:
            job = self.table.jobs.get(job_id) or await self.store.get_job(job_id)
            if job is not None and not self.access.may_act(peer, job):
                raise ProtocolError(protocol.FORBIDDEN, f"not allowed: {req.type} job {job_id}")
        results = []
        for job_id in req.ids:
            try:
                done = await act(await find_job(self.engine, job_id))
                results.append({"id": job_id, "ok": True, **done})
            except ProtocolError as exc:
                results.append({"id": job_id, "ok": False, "error": exc.message})
        return {"ok": True, "results": results}

    async def restart(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        async def act(job: Job) -> dict[str, Any]:
            if not job.state.terminal:
                raise ProtocolError(protocol.INVALID_STATE, f"is still {job.state.value}")
            await self.intake.check_after(job.spec.after, job.spec.after_any)
            new, _ = await self.intake.enqueue([job.spec], job.spec.owner_uid)
            return {"new_id": new[0]}

        return await self._each(req, peer, act)

    async def hold(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        hold = req.type == "hold"

        async def act(job: Job) -> dict[str, Any]:
            # The engine's turn decides: the job may have started or ended while the
            # command waited for it, and the client hears what was done.
            verdict = (await self.engine.do(HoldJob(job.id, hold, peer.uid))).verdicts.get(job.id)
            if verdict is None:  # no longer in the table: it ended
                ended = await find_job(self.engine, job.id)
                why = hold_refusal(ended, hold) or f"is {ended.state.value}"
                raise ProtocolError(protocol.INVALID_STATE, why)
            if not verdict.ok:
                raise ProtocolError(protocol.INVALID_STATE, verdict.text)
            return {"held": hold}

        return await self._each(req, peer, act)

    async def update(self, req: Update, peer: Peer) -> dict[str, Any]:
        async def act(job: Job) -> dict[str, Any]:
            if req.cards:  # a card the machine lacks, or fewer than the job asks for
                self.intake.pinned(job.spec.gpus, req.cards)
            cmd = UpdateJob(job.id, peer.uid, req.priority, req.time_limit_s, req.cards)
            verdict = (await self.engine.do(cmd)).verdicts.get(job.id)
            if verdict is None:  # no longer in the table: it ended
                ended = await find_job(self.engine, job.id)
                raise ProtocolError(protocol.INVALID_STATE, update_refusal(ended) or "ended")
            if not verdict.ok:
                raise ProtocolError(protocol.INVALID_STATE, verdict.text)
            return {"updated": verdict.text == "updated"}

        return await self._each(req, peer, act)

    async def pause(self, peer: Peer, paused: bool) -> dict[str, Any]:
        if peer.uid != os.geteuid() and not self.access.is_admin(peer.uid):
            raise ProtocolError(protocol.FORBIDDEN, "not allowed: only admins pause the queue")
        marker = self.state_dir / PAUSED_FILE
        try:
            if not paused:
                marker.unlink(missing_ok=True)
            elif not marker.exists():  # paused already: who paused it, and when, stay
                _write_marker(marker, f"paused by uid {peer.uid} at {now_iso()}\n")
        except OSError as exc:  # the marker is what makes a pause outlive a restart
            raise StorageError(storage_reason(exc) or "cannot write", str(exc)) from None
        self.dispatcher.set_paused(paused)
        if paused:
            # The parked spawns are dropped before any Stop: a Stop the database refuses
            # now leaves its job's end to be recorded (`interrupted`) once it takes writes.
            with contextlib.suppress(StorageError):
                await self.dispatcher.release_ahead("the queue was paused before it started")
        self.dispatcher.poke()
        return {"ok": True, "paused": paused}

    def own_active(self, peer: Peer) -> tuple[int, ...]:
        return tuple(sorted(j.id for j in self.table.jobs.values() if j.spec.owner_uid == peer.uid))

    async def clean(self, req: Clean, peer: Peer) -> dict[str, Any]:
        owner = None if self.access.is_admin(peer.uid) else peer.uid
        ids = await jobrows.cleanable(self.store, owner, time.time() - req.older_than_s)
        if ids:
            await self.engine.do(Forget(tuple(ids)))
        freed = joblogs.remove(self.logs_dir, ids)
        return {"ok": True, "removed": ids, "freed_mb": -(-freed // (1 << 20))}

    # ---- run: a job tied to its client's connection ----------------------------------

    def holds_run_jobs(self, conn: int) -> bool:
        """Whether closing this connection would cancel `run` jobs."""
        return bool(self.bound.get(conn))

    def bind(self, peer: Peer, job_id: int) -> None:
        self.bound.setdefault(peer.conn, set()).add(job_id)

    async def connection_closed(self, peer: Peer) -> None:
        """The client of `run` jobs went away: cancel what is left of them. Not while
        draining: then the daemon, not the client, is going away."""
        ids = self.bound.pop(peer.conn, set())
        active = [i for i in sorted(ids) if i in self.table.jobs]
        if not active or self.draining():
            return
        with anyio.move_on_after(CLOSE_CANCEL_S, shield=True):
            for job_id in active:
                await self.engine.do(Cancel(job_id))


def _write_marker(path: Path, text: str) -> None:
    """All of it or no file: an empty marker left by a failed write would pause the
    next daemon without anyone having paused it."""
    try:
        path.write_text(text)
    except OSError:
        path.unlink(missing_ok=True)
        raise
