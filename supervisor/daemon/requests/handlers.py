"""Request handlers: what each request does, through the engine and the store."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Literal, cast

import anyio
import structlog

from supervisor.core.commands import Cancel, Changed, ProcessStarted
from supervisor.core.jobs import Job, JobState
from supervisor.core.records import Attempt, Event
from supervisor.core.table import Phase, waiting_ahead
from supervisor.daemon import views
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import Config
from supervisor.daemon.dispatcher import Dispatcher
from supervisor.daemon.engine import Engine
from supervisor.daemon.requests.access import Access, forbidden
from supervisor.daemon.requests.everyday import Verbs
from supervisor.daemon.requests.intake import Intake, find_job
from supervisor.daemon.requests.intake import warnings as intake_warnings
from supervisor.daemon.requests.server import Peer, Pieces
from supervisor.daemon.requests.waiting import Ends
from supervisor.daemon.store import job_queries as jobrows
from supervisor.daemon.store import output_files as joblogs
from supervisor.daemon.store.database import StorageError
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.wire import protocol
from supervisor.wire.edits import Update
from supervisor.wire.protocol import (
    ArrayRef,
    Clean,
    JobRef,
    ListJobs,
    ProtocolError,
    Request,
    Simple,
    Submit,
)
from supervisor.wire.shapes import (
    CancelReply,
    CancelResult,
    JobJson,
    ListReply,
    LogsReply,
    PublicJobJson,
    ShowReply,
    SubmitReply,
    WaitReply,
)

log = structlog.get_logger("gpusvd.server")
LOG_CHUNK = 512 * 1024
START_WAIT_S = 10.0  # the longest `show` waits for a start in flight
DRY_PIECE = 1000  # job views of a dry run made and sent at a time


class Api:
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        book: MemoryBook,
        access: Access,
        broker: Broker,
        *,
        dispatcher: Dispatcher,
        live_rss: Callable[[int], tuple[int, int, int] | None],
        card_count: Callable[[], int],
        card_vram_mb: Callable[[], int],
        simple: dict[str, Callable[[Peer], Awaitable[dict[str, Any]]]],
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.table = engine.table
        self.book = book
        self.access = access
        self.store = engine.store
        self.dispatcher = dispatcher
        self.draining: Callable[[], bool] = lambda: dispatcher.draining
        self.live_rss = live_rss
        self.ends = Ends()
        self.starting: dict[int, list[anyio.Event]] = {}
        broker.subscribe(Changed, self._changed)
        broker.subscribe(ProcessStarted, lambda ev: self._wake(self.starting, ev.job_id))
        self.simple = simple
        self.logs_dir = joblogs.logs_dir(cfg.state_dir)
        self.intake = Intake(
            cfg,
            engine,
            book,
            access,
            card_count=card_count,
            card_vram_mb=card_vram_mb,
            host_room=lambda: (dispatcher.limit_mb, dispatcher.reserve_mb),
        )
        self.verbs = Verbs(
            engine,
            access,
            self.intake,
            dispatcher,
            state_dir=cfg.state_dir,
            draining=self.draining,
        )

    def reconfigure(self, cfg: Config) -> None:
        """A reloaded config: new submits take its defaults and limits."""
        self.cfg = cfg
        self.intake.reconfigure(cfg)

    def _changed(self, ev: Changed) -> None:
        if ev.new.state.terminal:
            self.ends.changed(ev.new)
            self._wake(self.starting, ev.new.id)

    @staticmethod
    def _wake(waiting: dict[int, list[anyio.Event]], job_id: int) -> None:
        for event in waiting.pop(job_id, []):
            event.set()

    async def _started(self, job_id: int) -> None:
        """A job shown running has its process: a start in flight is waited for (it
        takes a fork and a commit), so that `show` never gives a running attempt no pid;
        not one started ahead, which waits for the job in front of it (`starting`)."""
        live = self.table.live.get(job_id)
        if live is None or live.phase is Phase.RUNNING or waiting_ahead(live, self.table.live):
            return
        event = anyio.Event()
        self.starting.setdefault(job_id, []).append(event)
        with anyio.move_on_after(START_WAIT_S):
            await event.wait()

    # ---- dispatch -------------------------------------------------------------------

    async def handle(self, req: Request, peer: Peer) -> dict[str, Any]:
        try:
            with self.store.answering():  # a request that cannot be recorded is refused
                return await self._handle(req, peer)
        except StorageError as exc:
            raise ProtocolError(protocol.STORAGE, f"{exc}; nothing was done") from None

    async def _handle(self, req: Request, peer: Peer) -> dict[str, Any]:
        if isinstance(req, Submit):
            return dict(await self.submit(req, peer))
        if isinstance(req, ArrayRef):
            return await self.intake.restart_array(req, peer)
        if isinstance(req, ListJobs):
            return dict(await self.list(req, peer))
        if isinstance(req, JobRef):
            handlers: dict[str, Callable[[JobRef, Peer], Awaitable[Any]]] = {
                "show": self.show,
                "cancel": self.cancel,
                "wait": self.wait,
                "logs": self.logs,
                "restart": self.verbs.restart,
                "hold": self.verbs.hold,
                "release": self.verbs.hold,
            }
            return dict(await handlers[req.type](req, peer))
        if isinstance(req, Clean):
            return await self.verbs.clean(req, peer)
        if isinstance(req, Update):
            return await self.verbs.update(req, peer)
        assert isinstance(req, Simple)
        if req.type == "ping":
            return {"ok": True, "pid": os.getpid(), "version": protocol.VERSION}
        if req.type in ("pause", "resume"):
            return await self.verbs.pause(peer, req.type == "pause")
        if req.type not in self.simple:
            raise ProtocolError(protocol.UNKNOWN_TYPE, f"'{req.type}' is not served here")
        return await self.simple[req.type](peer)

    # ---- submit ---------------------------------------------------------------------

    async def submit(self, req: Submit, peer: Peer) -> SubmitReply:
        self.access.may_submit(peer)
        if self.draining() and not req.options.dry_run:
            raise ProtocolError(protocol.DRAINING, "gpusvd is stopping; submit again later")
        self.intake.check_fits(req)
        await self.intake.check_after(req.options.after, req.options.after_any)
        if req.options.dry_run:
            return await self._dry_run(req, peer)
        specs = self.intake.specs(req, await self.intake.mem_keys(req), peer)
        await self.intake.check_share(specs)
        notes = await self.intake.over_limit(specs)
        rid = req.options.request_id
        ids, repeated = await self.intake.enqueue(specs, peer.uid, rid, notes)
        if req.options.run:  # a repeat too: a `run` client back after a restart re-ties it
            self.verbs.bind(peer, ids[0])
        reply = await self._committed(req, ids, repeated)
        if notes and not repeated:
            reply["warnings"] = intake_warnings(notes, ids)
        return reply

    async def _dry_run(self, req: Submit, peer: Peer) -> SubmitReply:
        """What a submit would make, made nothing of. The jobs are checked, and their
        views made as they are sent (`Pieces`), DRY_PIECE at a time: the specs and views
        of 100,000 jobs would hold hundreds of MB at once, and the heap would keep much of
        it after they are freed (what a request leaves behind pins what it freed)."""
        found: dict[int, tuple[Event, ...]] = {}
        keys = await self.intake.mem_keys(req)
        for start in range(0, len(req.argvs), DRY_PIECE):
            specs = self.intake.specs(req, keys, peer, start, start + DRY_PIECE)
            await self.intake.check_share(specs)
            for i, evs in enumerate(await self.intake.over_limit(specs), start):
                if evs:
                    found[i] = evs
            await anyio.sleep(0)  # the loop turns between pieces
        dry: SubmitReply = {
            "ok": True,
            "jobs": cast(Any, Pieces(self._dry_views(req, keys, peer))),
        }
        if found:
            notes = tuple(found.get(i, ()) for i in range(len(req.argvs)))
            dry["warnings"] = intake_warnings(notes, None)
        return dry

    def _dry_views(
        self, req: Submit, keys: Mapping[tuple[str, ...], str], peer: Peer
    ) -> Iterator[list[JobJson]]:
        """The views of a dry run's jobs, DRY_PIECE at a time."""
        for start in range(0, len(req.argvs), DRY_PIECE):
            piece: list[JobJson] = []
            for spec in self.intake.specs(req, keys, peer, start, start + DRY_PIECE):
                view = views.job_json(Job(id=0, spec=spec), host_memory=self.book.projection(spec))
                view["id"] = None
                piece.append(view)
            yield piece

    async def _committed(self, req: Submit, ids: list[int], repeated: bool) -> SubmitReply:
        """The jobs made (or, for a repeat, the first submit's): the ids at least, never
        an error, since they exist; a job cleaned since, or a fault in its view, leaves
        out the job's view alone."""
        reply: SubmitReply = {"ok": True, "ids": ids}
        if req.type == "submit" and len(ids) == 1:
            try:
                reply["job"] = self.job_view(await self._job(ids[0]))
            except ProtocolError:
                pass
            except Exception:
                log.exception("submitted job not shown", job_id=ids[0])
        if repeated:  # a client retrying: the first jobs, not more
            reply["repeated"] = True
        return reply

    # ---- reading --------------------------------------------------------------------

    def job_view(self, job: Job) -> JobJson:
        return views.job_json(
            job,
            host_memory=self.book.projection(job.spec),
            stopping=views.stopping(self.table, job.id),
            starting=views.starting(self.table, job.id),
        )

    async def _job(self, job_id: int) -> Job:
        return await find_job(self.engine, job_id)

    async def list(self, req: ListJobs, peer: Peer) -> ListReply:
        since = None if req.recent_s is None else time.time() - req.recent_s
        rows = await jobrows.list_jobs(
            self.store,
            req.states,
            req.limit,
            req.before_id,
            owner_uid=req.owner_uid,
            ended_since=since,
            array=req.array,
            name=req.name,
            labels=req.labels,
        )
        admin = self.access.is_admin(peer.uid)  # once: a group lookup may go to the network
        # A filter on text that the public view hides leaves out others' jobs: their
        # names and labels must not be found out by matching them.
        by_text = req.name is not None or bool(req.labels)
        out: list[JobJson | PublicJobJson] = []
        for row in rows:
            job = self.table.jobs.get(row.id, row)
            mine = admin or job.spec.owner_uid == peer.uid
            if by_text and not mine:
                continue
            full = self.job_view(job)
            out.append(full if mine else views.public_view(full))
        return {"ok": True, "jobs": out, "paused": self.dispatcher.paused}

    async def show(self, req: JobRef, peer: Peer) -> ShowReply:
        job = await self._job(req.ids[0])
        if not self.access.may_act(peer, job):
            raise forbidden(f"job {job.id} belongs to uid {job.spec.owner_uid}")
        await self.book.load(job.spec.mem_key)
        job_id = job.id

        async def read() -> tuple[Job, list[Attempt], list[dict[str, Any]]]:
            return (
                await self._job(job_id),
                await self.store.attempts(job_id),
                await self.store.events(job_id),
            )

        job, attempts, events = await self.engine.read(read)  # of one moment
        if job.state is JobState.RUNNING and attempts and attempts[-1].pid is None:
            await self._started(job_id)
            await self.store.settle()  # its pid, where it still waits to ride along
            job, attempts, events = await self.engine.read(read)
        obj = views.job_json(
            job,
            host_memory=self.book.projection(job.spec),
            attempts=attempts,
            events=events,
            stopping=views.stopping(self.table, job.id),
            starting=views.starting(self.table, job.id),
        )
        live = self.live_rss(job.id)
        shown = obj.get("attempts")
        if live is not None and shown:  # the running attempt's figures so far
            shown[-1]["rss_mb"], peak, peak_vram = live
            shown[-1]["peak_rss_mb"] = peak or None
            shown[-1]["peak_vram_mb"] = peak_vram or None
        return {"ok": True, "job": obj, "paused": self.dispatcher.paused}

    async def cancel(self, req: JobRef, peer: Peer) -> CancelReply:
        if req.all:
            req = dataclasses.replace(req, ids=self.verbs.own_active(peer))
        for job_id in req.ids:  # all allowed, or nothing is cancelled
            job = self.table.jobs.get(job_id) or await self.store.get_job(job_id)
            if job is not None and not self.access.may_act(peer, job):
                raise forbidden(f"cancel job {job_id} of uid {job.spec.owner_uid}")
        results: list[CancelResult] = []
        for job_id in req.ids:
            try:
                job = await self._job(job_id)
            except ProtocolError as exc:
                results.append({"id": job_id, "ok": False, "error": exc.message})
                continue
            if job.state.terminal:
                results.append({"id": job_id, "ok": False, "error": f"already {job.state.value}"})
                continue
            # The engine's turn decides: "cancelled" when nothing of the job will run,
            # "cancelling" while its attempt is stopped (it ends cancelled all the same);
            # none when it ended while the cancel waited for its turn.
            verdict = (await self.engine.do(Cancel(job_id))).verdicts.get(job_id)
            if verdict is None:
                ended = await self._job(job_id)
                results.append({"id": job_id, "ok": False, "error": f"already {ended.state.value}"})
                continue
            state: Literal["cancelled", "cancelling"] = (
                "cancelled" if verdict.text == "cancelled" else "cancelling"
            )
            results.append({"id": job_id, "ok": True, "state": state})
        return {"ok": True, "results": results}

    async def wait(self, req: JobRef, peer: Peer) -> WaitReply:
        done: list[JobJson | PublicJobJson] = []
        # Those in the table are watched from now (before any await); the others have
        # ended already, and are read in a few queries, not one each.
        live = {i for i in req.ids if i in self.table.jobs}
        timeout = req.timeout_s if req.timeout_s is not None else 10**9
        with self.ends.watching(live) as watch, anyio.move_on_after(timeout):
            stored = await self.store.get_jobs([i for i in req.ids if i not in live])
            ended = {i: job for i, job in stored.items() if job.state.terminal}
            for job_id in req.ids:
                job = watch.ended.pop(job_id, None) or ended.get(job_id) or await self._job(job_id)
                if not job.state.terminal:
                    job = await watch.until_ended(job_id)
                view = self.job_view(job)
                done.append(view if self.access.may_act(peer, job) else views.public_view(view))
            return {"ok": True, "jobs": done, "timed_out": False}
        return {"ok": True, "jobs": done, "timed_out": True}

    async def logs(self, req: JobRef, peer: Peer) -> LogsReply:
        job = await self._job(req.ids[0])
        if not self.access.may_act(peer, job):
            raise forbidden(f"logs of job {job.id}")
        if req.stream == "both":
            out = self.logs_dir / f"{job.id}.out"
            return joblogs.merged_reply(out, req.offset, LOG_CHUNK, req.tail_lines, job.state)
        path = self.logs_dir / f"{job.id}.{'out' if req.stream == 'stdout' else 'err'}"
        return joblogs.chunk_reply(path, req.offset, LOG_CHUNK, req.tail_lines, job.state)
