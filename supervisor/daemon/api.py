"""Request handlers: who may do what, and what each request does to the scheduler."""

from __future__ import annotations

import base64
import dataclasses
import grp
import os
import pwd
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.projection import mem_key
from supervisor.daemon import joblogs, jobrows, views
from supervisor.daemon.config import Config
from supervisor.daemon.scheduler import Scheduler
from supervisor.daemon.server import Peer
from supervisor.daemon.store import StorageError
from supervisor.daemon.verbs import Verbs
from supervisor.wire import protocol
from supervisor.wire.protocol import (
    Clean,
    JobRef,
    ListJobs,
    ProtocolError,
    Request,
    Simple,
    Submit,
)

LOG_CHUNK = 512 * 1024


def _forbidden(what: str) -> ProtocolError:
    return ProtocolError(protocol.FORBIDDEN, f"not allowed: {what}")


class Api:
    def __init__(
        self,
        cfg: Config,
        sched: Scheduler,
        *,
        stop_job: Callable[[int], Awaitable[None]],
        card_count: Callable[[], int],
        card_vram_mb: Callable[[], int],
        simple: dict[str, Callable[[Peer], Awaitable[dict[str, Any]]]],
    ) -> None:
        self.cfg = cfg
        self.sched = sched
        self.store = sched.store
        self.stop_job = stop_job
        self.card_count = card_count
        self.card_vram_mb = card_vram_mb
        self.simple = simple
        self.logs_dir = cfg.state_dir / "logs"
        # The per-user cap is counted and then filled: two submits must not both pass it.
        self.submitting = anyio.Lock()
        self.verbs = Verbs(self)

    # ---- identity -------------------------------------------------------------------

    def is_admin(self, uid: int) -> bool:
        if uid == 0:
            return True
        if not self.cfg.admin_group:
            return False
        try:
            group = grp.getgrnam(self.cfg.admin_group)
            user = pwd.getpwuid(uid)
        except KeyError:
            return False
        return group.gr_gid in os.getgrouplist(user.pw_name, user.pw_gid)

    def admit(self, peer: Peer) -> str | None:
        """A non-root daemon can only run jobs as itself: it serves its own user (and
        admins, who may watch and cancel); a root daemon serves whoever reached the
        socket, which its mode and group already restrict."""
        me = os.geteuid()
        if me == 0 or peer.uid == me or self.is_admin(peer.uid):
            return None
        return f"this gpusvd runs as uid {me} and serves only that user"

    def may_act(self, peer: Peer, job: Job) -> bool:
        return peer.uid == job.spec.owner_uid or self.is_admin(peer.uid)

    def may_submit(self, peer: Peer) -> None:
        """A job runs as its submitter; a non-root daemon can only run jobs as itself, so
        there only its own user submits (admins of such a daemon watch and cancel)."""
        me = os.geteuid()
        if me != 0 and peer.uid != me:
            raise _forbidden(f"this gpusvd runs as uid {me} and runs jobs only for that user")

    # ---- dispatch -------------------------------------------------------------------

    async def handle(self, req: Request, peer: Peer) -> dict[str, Any]:
        try:
            with self.store.answering():  # a request that cannot be recorded is refused
                return await self._handle(req, peer)
        except StorageError as exc:
            raise ProtocolError(protocol.STORAGE, f"{exc}; nothing was done") from None

    async def _handle(self, req: Request, peer: Peer) -> dict[str, Any]:
        if isinstance(req, Submit):
            return await self.submit(req, peer)
        if isinstance(req, ListJobs):
            return await self.list(req, peer)
        if isinstance(req, JobRef):
            handler = {
                "show": self.show,
                "cancel": self.cancel,
                "wait": self.wait,
                "logs": self.logs,
                "restart": self.verbs.restart,
                "hold": self.verbs.hold,
                "release": self.verbs.hold,
            }[req.type]
            return await handler(req, peer)
        if isinstance(req, Clean):
            return await self.verbs.clean(req, peer)
        assert isinstance(req, Simple)
        if req.type == "ping":
            return {"ok": True, "pid": os.getpid(), "version": protocol.VERSION}
        if req.type in ("pause", "resume"):
            return await self.verbs.pause(peer, req.type == "pause")
        if req.type not in self.simple:
            raise ProtocolError(protocol.UNKNOWN_TYPE, f"'{req.type}' is not served here")
        return await self.simple[req.type](peer)

    # ---- submit ---------------------------------------------------------------------

    def _check_fits(self, req: Submit) -> None:
        opts = req.options
        cards = self.card_count()
        if opts.gpus > cards:
            hint = "; submit with --gpus 0 for a CPU-only job" if cards == 0 else ""
            raise ProtocolError(
                protocol.BAD_REQUEST,
                f"asks for {opts.gpus} GPUs; this machine has {cards or 'none'}{hint}",
            )
        if opts.vram_mb is not None and opts.gpus and opts.vram_mb > self.card_vram_mb():
            raise ProtocolError(
                protocol.BAD_REQUEST,
                f"asks for {opts.vram_mb} MiB of VRAM; the largest card has "
                f"{self.card_vram_mb()} MiB",
            )

    async def check_after(self, after: tuple[int, ...]) -> None:
        for parent in after:
            if parent not in self.sched.jobs and await self.store.get_job(parent) is None:
                raise ProtocolError(protocol.NOT_FOUND, f"--after: no job {parent}")

    def specs(self, req: Submit, peer: Peer) -> list[JobSpec]:
        o = self.cfg
        opts = req.options
        timeout = opts.progress_timeout_s
        return [
            JobSpec(
                argv=argv,
                cwd=opts.cwd,
                env=opts.env,
                owner_uid=peer.uid,
                owner_gid=peer.gid,
                name=req.names[i] if req.names else opts.name,
                labels=opts.labels,
                gpus=opts.gpus,
                vram_mb=opts.vram_mb,
                mem_mb=opts.mem_mb,
                mem_key=mem_key(argv, opts.mem_key),
                mem_scale=opts.mem_scale,
                retries=o.retries.ordinary if opts.retries is None else opts.retries,
                gpu_hang_retries=(
                    o.retries.gpu_hang if opts.gpu_hang_retries is None else opts.gpu_hang_retries
                ),
                progress_timeout_s=o.watchdog.progress_timeout_s if timeout is None else timeout,
                progress_regex=opts.progress_regex,
                priority=opts.priority,
                after=opts.after,
                time_limit_s=opts.time_limit_s,
                stall_timeout_s=_or(opts.stall_timeout_s, o.watchdog.stall_timeout_s),
            )
            for i, argv in enumerate(req.argvs)
        ]

    async def submit(self, req: Submit, peer: Peer) -> dict[str, Any]:
        self.may_submit(peer)
        if self.sched.draining and not req.options.dry_run:
            raise ProtocolError(protocol.DRAINING, "gpusvd is stopping; submit again later")
        self._check_fits(req)
        await self.check_after(req.options.after)
        specs = self.specs(req, peer)
        if req.options.dry_run:
            out = []
            for spec in specs:
                await self.sched.load_history(spec.mem_key)
                job = Job(id=0, spec=spec)
                out.append(views.job_json(job, host_memory=self.sched.projection(spec)))
                out[-1]["id"] = None
            return {"ok": True, "jobs": out}
        jobs = await self.enqueue(specs, peer.uid)
        if req.options.run:
            self.verbs.bind(peer, jobs[0].id)
        if req.type == "submit" and len(jobs) == 1:
            job = jobs[0]
            return {"ok": True, "ids": [job.id], "job": self.job_view(job)}
        return {"ok": True, "ids": [j.id for j in jobs]}

    async def enqueue(self, specs: list[JobSpec], uid: int) -> list[Job]:
        """Queue new jobs of `uid`, within its cap of active jobs."""
        async with self.submitting:
            queued = await self.store.queued_count(uid)
            if queued + len(specs) > self.cfg.max_queued_per_user:
                raise ProtocolError(
                    protocol.LIMIT,
                    f"uid {uid} has {queued} active jobs; the limit is "
                    f"{self.cfg.max_queued_per_user}",
                )
            return await self.sched.submit(specs)

    # ---- reading --------------------------------------------------------------------

    def job_view(self, job: Job) -> dict[str, Any]:
        return views.job_json(job, host_memory=self.sched.projection(job.spec))

    async def job(self, job_id: int) -> Job:
        job = self.sched.jobs.get(job_id) or await self.store.get_job(job_id)
        if job is None:
            raise ProtocolError(protocol.NOT_FOUND, f"no job {job_id}")
        return job

    async def list(self, req: ListJobs, peer: Peer) -> dict[str, Any]:
        since = None if req.recent_s is None else time.time() - req.recent_s
        rows = await jobrows.list_jobs(
            self.store,
            req.states,
            req.limit,
            req.before_id,
            owner_uid=req.owner_uid,
            ended_since=since,
        )
        admin = self.is_admin(peer.uid)  # once: a group lookup may go to the network
        out = []
        for row in rows:
            job = self.sched.jobs.get(row.id, row)
            full = self.job_view(job)
            mine = admin or job.spec.owner_uid == peer.uid
            out.append(full if mine else views.public_view(full))
        return {"ok": True, "jobs": out}

    async def show(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        job = await self.job(req.ids[0])
        if not self.may_act(peer, job):
            raise _forbidden(f"job {job.id} belongs to uid {job.spec.owner_uid}")
        await self.sched.load_history(job.spec.mem_key)
        obj = views.job_json(
            job,
            host_memory=self.sched.projection(job.spec),
            attempts=await self.store.attempts(job.id),
            events=await self.store.events(job.id),
        )
        live = self.sched.running.get(job.id)
        if live is not None and obj["attempts"]:  # the running attempt's figures so far
            obj["attempts"][-1]["peak_rss_mb"] = live.peak_rss_mb or None
            obj["attempts"][-1]["rss_mb"] = live.rss_mb
        return {"ok": True, "job": obj}

    async def cancel_one(self, job_id: int, why: str) -> str:
        """Cancel one active job; its new state (cancelling: stopping a running one)."""
        job = self.sched.jobs.get(job_id)
        if job is None:
            return "gone"
        if job.state is JobState.QUEUED:
            await self.sched.cancel_queued(job, why)
            return "cancelled"
        await self.stop_job(job_id)
        return "cancelling"

    async def cancel(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        if req.all:
            req = dataclasses.replace(req, ids=self.verbs.own_active(peer))
        for job_id in req.ids:  # all allowed, or nothing is cancelled
            job = self.sched.jobs.get(job_id) or await self.store.get_job(job_id)
            if job is not None and not self.may_act(peer, job):
                raise _forbidden(f"cancel job {job_id} of uid {job.spec.owner_uid}")
        results = []
        for job_id in req.ids:
            try:
                job = await self.job(job_id)
            except ProtocolError as exc:
                results.append({"id": job_id, "ok": False, "error": exc.message})
                continue
            if job.state.terminal:
                results.append({"id": job_id, "ok": False, "error": f"already {job.state.value}"})
            else:
                state = await self.cancel_one(job_id, f"cancelled by uid {peer.uid}")
                results.append({"id": job_id, "ok": True, "state": state})
        return {"ok": True, "results": results}

    async def wait(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        done: list[dict[str, Any]] = []
        with anyio.move_on_after(req.timeout_s if req.timeout_s is not None else 10**9):
            for job_id in req.ids:
                job = await self.job(job_id)
                while not job.state.terminal:
                    event = anyio.Event()
                    self.sched.waiters.setdefault(job_id, []).append(event)
                    await event.wait()
                    job = await self.job(job_id)
                view = self.job_view(job)
                done.append(view if self.may_act(peer, job) else views.public_view(view))
            return {"ok": True, "jobs": done, "timed_out": False}
        return {"ok": True, "jobs": done, "timed_out": True}

    async def logs(self, req: JobRef, peer: Peer) -> dict[str, Any]:
        job = await self.job(req.ids[0])
        if not self.may_act(peer, job):
            raise _forbidden(f"logs of job {job.id}")
        path = self.logs_dir / f"{job.id}.{'out' if req.stream == 'stdout' else 'err'}"
        data, offset, size = joblogs.read(path, req.offset, LOG_CHUNK, req.tail_lines)
        return {
            "ok": True,
            "data_b64": base64.b64encode(data).decode(),
            "offset": offset + len(data),
            "size": size,
            "done": job.state.terminal and offset + len(data) >= size,
            "state": job.state.value,
        }


def _or(given: float | None, default: float) -> float | None:
    """A job's own timeout, else the configured default; 0 (off) becomes None."""
    value = default if given is None else given
    return value or None
