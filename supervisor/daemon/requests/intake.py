"""New jobs in: a submit checked against the machine and the user's cap of active jobs,
then queued through the engine; and the one way a request finds a job by id."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio

from supervisor.core import pinning
from supervisor.core.commands import SubmitJobs
from supervisor.core.host_fit import over_limit
from supervisor.core.jobs import Job, JobSpec, JobState
from supervisor.core.records import Event
from supervisor.daemon.config import Config
from supervisor.daemon.engine import Engine, submitted_ids
from supervisor.daemon.programs import Lookups
from supervisor.daemon.requests.access import Access, forbidden
from supervisor.daemon.requests.server import Peer
from supervisor.daemon.requests.submit_specs import job_specs
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.wire import protocol
from supervisor.wire.protocol import ArrayRef, ProtocolError, Submit


async def find_job(engine: Engine, job_id: int) -> Job:
    """The job as the live table has it, else as stored; `not_found` when neither has it."""
    job = engine.table.jobs.get(job_id) or await engine.store.get_job(job_id)
    if job is None:
        raise ProtocolError(protocol.NOT_FOUND, f"no job {job_id}")
    return job


class Intake:
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        book: MemoryBook,
        access: Access,
        *,
        card_count: Callable[[], int],
        card_vram_mb: Callable[[], int],
        host_room: Callable[[], tuple[int, int]] = lambda: (1 << 62, 0),
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.book = book
        self.access = access
        self.card_count = card_count
        self.card_vram_mb = card_vram_mb
        self.host_room = host_room  # the host_memory limit and reserve, MiB, as admitted
        self.lookups = Lookups()
        # The per-user cap is counted and then filled: two submits must not both pass it.
        self.submitting = anyio.Lock()

    def reconfigure(self, cfg: Config) -> None:
        """A reloaded config: new jobs take its defaults and limits."""
        self.cfg = cfg

    def check_fits(self, req: Submit) -> None:
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

    async def check_share(self, specs: list[JobSpec]) -> None:
        """A shared job takes one card and must say how much of its VRAM, or have a
        memory key whose earlier runs did."""
        for spec in specs:
            if not spec.share:
                continue
            if spec.gpus != 1:
                raise ProtocolError(
                    protocol.BAD_REQUEST, f"--share takes one GPU; this job asks for {spec.gpus}"
                )
            await self.book.load(spec.mem_key)
            if self.book.vram_need(spec) is None:
                raise ProtocolError(
                    protocol.BAD_REQUEST,
                    f"--share needs --vram: memory key {spec.mem_key!r} has no VRAM history",
                )

    async def check_after(self, after: tuple[int, ...], after_any: tuple[int, ...] = ()) -> None:
        for flag, ids in (("--after", after), ("--after-any", after_any)):
            for parent in ids:
                known = parent in self.engine.table.jobs
                if not known and await self.engine.store.get_job(parent) is None:
                    raise ProtocolError(protocol.NOT_FOUND, f"{flag}: no job {parent}")

    async def over_limit(self, specs: list[JobSpec]) -> tuple[tuple[Event, ...], ...]:
        """For each spec, the `mem_over_limit` event when its figure (declared or
        projected) is more than jobs may use together: told at submit, since such a job
        starts only alone (admission's lone-job rule)."""
        limit_mb, reserve_mb = self.host_room()
        notes: list[tuple[Event, ...]] = []
        for spec in specs:
            await self.book.load(spec.mem_key)
            ev = over_limit(self.book.projection(spec), limit_mb=limit_mb, reserve_mb=reserve_mb)
            notes.append(() if ev is None else (ev,))
        return tuple(notes) if any(notes) else ()

    async def mem_keys(self, req: Submit) -> dict[tuple[str, ...], str]:
        """Each distinct command's memory key, its program looked up off the loop."""
        opts = req.options
        return await self.lookups.mem_keys(req.argvs, opts.mem_key, opts.cwd, opts.env.get("PATH"))

    def specs(
        self,
        req: Submit,
        keys: Mapping[tuple[str, ...], str],
        peer: Peer,
        start: int = 0,
        stop: int | None = None,
    ) -> list[JobSpec]:
        """The specs of the request's jobs (those from `start` to `stop`)."""
        opts = req.options
        cards = self.pinned(opts.gpus, opts.cards, opts.not_cards)
        cfg = self.cfg
        return job_specs(
            req, keys, peer.uid, peer.gid, cfg.retries, cfg.watchdog, cards, start, stop
        )

    def pinned(
        self, gpus: int, cards: tuple[int, ...] | None, not_cards: tuple[int, ...] | None = None
    ) -> tuple[int, ...] | None:
        """The cards a job may use (None: any), or `bad_request` when there are none it
        could ever run on: a card this machine does not have, or fewer than it asks for."""
        try:
            allowed = pinning.resolve(cards, not_cards, range(self.card_count()))
        except ValueError as exc:
            raise ProtocolError(protocol.BAD_REQUEST, str(exc)) from None
        why = pinning.refusal(gpus, allowed)
        if why is not None:
            raise ProtocolError(protocol.BAD_REQUEST, why)
        return allowed

    async def _within_cap(self, uid: int, adding: int) -> None:
        queued = await self.engine.store.queued_count(uid)
        if queued + adding > self.cfg.max_queued_per_user:
            raise ProtocolError(
                protocol.LIMIT,
                f"uid {uid} has {queued} active jobs; the limit is {self.cfg.max_queued_per_user}",
            )

    async def enqueue(
        self,
        specs: list[JobSpec],
        uid: int,
        request_id: str | None = None,
        notes: tuple[tuple[Event, ...], ...] = (),
    ) -> tuple[list[int], bool]:
        """Queue new jobs of `uid`, within its cap of active jobs: their ids, and whether
        `request_id` was seen before (then the ids are the first submit's, nothing new)."""
        async with self.submitting:
            if request_id is not None:
                first = await self.engine.store.request_ids(uid, request_id)
                if first is not None:
                    return first, True
            await self._within_cap(uid, len(specs))
            for key in {s.mem_key for s in specs}:
                await self.book.load(key)
            done = await self.engine.do(
                SubmitJobs(tuple(specs), request_id=request_id, notes=notes)
            )
            return submitted_ids(done), False

    async def restart_array(self, req: ArrayRef, peer: Peer) -> dict[str, Any]:
        """The array's failed indices (those whose newest job failed) as new jobs of it."""
        self.access.may_submit(peer)
        jobs = await self.engine.store.list_jobs((), protocol.MAX_LIST, None, req.array)
        if not jobs:
            raise ProtocolError(protocol.NOT_FOUND, f"no array {req.array}")
        newest: dict[int | None, Job] = {}
        for job in sorted(jobs, key=lambda j: j.id):
            newest[job.spec.array_index] = self.engine.table.jobs.get(job.id, job)
        failed = [j for j in newest.values() if j.state is JobState.FAILED]
        for job in failed:
            if not self.access.may_act(peer, job):
                raise forbidden(f"job {job.id} belongs to uid {job.spec.owner_uid}")
        if not failed:
            return {"ok": True, "ids": []}
        specs = [job.spec for job in failed]
        async with self.submitting:
            await self._within_cap(peer.uid, len(specs))
            ids = submitted_ids(await self.engine.do(SubmitJobs(tuple(specs))))
        return {"ok": True, "ids": ids}


def warnings(notes: tuple[tuple[Event, ...], ...], ids: list[int] | None) -> list[str]:
    """The notes as lines for the submitter's stderr: one per message, naming its jobs."""
    by_message: dict[str, list[int]] = {}
    for i, evs in enumerate(notes):
        for ev in evs:
            by_message.setdefault(ev.message, []).append(ids[i] if ids else i)
    if not ids:
        return list(by_message)
    out = []
    for message, which in by_message.items():
        shown = ", ".join(map(str, which[:5])) + (
            f" and {len(which) - 5} more" if len(which) > 5 else ""
        )
        out.append(f"job{'s' if len(which) > 1 else ''} {shown}: {message}")
    return out
