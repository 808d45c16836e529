"""The runner: performs the engine's Spawn and Kill actions and reports back.

It starts a claimed attempt's process through its keeper (keepers.py), keeps its live
figures (RSS, peak), gathers the facts of its end (exit status, hang and OOM evidence)
and sends them to the engine, which decides what the end means (core/outcome.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from supervisor.core import oom as ranking
from supervisor.core.commands import Ended, Kill, Spawn, Spawning, Started, Stop
from supervisor.core.jobs import ExitStatus, FailureReason, Job, classify_exit
from supervisor.core.outcome import Facts, keeper_death
from supervisor.core.table import Phase
from supervisor.daemon.broker import Broker
from supervisor.daemon.clock import now_iso
from supervisor.daemon.config import Config
from supervisor.daemon.engine import Engine
from supervisor.daemon.running import oom_scores as oom
from supervisor.daemon.running.ahead import Ahead, Sending, answers, behind
from supervisor.daemon.running.handles import KeptProcess, ended_by_gpusvd, kill_through, never_ran
from supervisor.daemon.running.keepers import KeeperGone, Keepers, SpawnDropped, keeper_name
from supervisor.daemon.running.launch import SpawnError, user_of
from supervisor.daemon.running.oom_rank import OomRank
from supervisor.daemon.running.procs import Evidence, Proc, may_have_leftovers, peak_mb
from supervisor.daemon.running.tasks import Tasks
from supervisor.daemon.store import output_files as joblogs
from supervisor.gpus import apply_visibility
from supervisor.keeper.client import KeeperError
from supervisor.keeper.spawn import Spec

if TYPE_CHECKING:
    from supervisor.daemon.watch.gpu_monitor import GpuMonitor

log = structlog.get_logger("gpusvd.attempts")

__all__ = ["Evidence", "Proc", "Runner"]


class Runner:
    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        broker: Broker,
        evidence: Evidence,
        monitor: GpuMonitor,
        *,
        logs_dir: Path,
        abort: Callable[[Callable[[], Any], str], Any],
        keepers: Keepers,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.evidence = evidence
        self.monitor = monitor
        self.logs_dir = logs_dir
        self._logs_str = str(logs_dir)
        self.abort = abort
        self.procs: dict[int, Proc] = {}
        self.keepers = keepers
        self._adopted: list[Proc] = []  # taken back at start-up; watched once run() starts
        self.ranks = OomRank(self.procs, ranking.base_value(oom.read_value() or 0))
        self._tasks: Tasks | None = None  # one a job: launch, watch, kill
        self._early: list[Spawn | Kill] = []  # orders published before run() began
        self._ahead: dict[int, Ahead] = {}  # started ahead, its spawn not answered yet
        self._sending: dict[int, Sending] = {}  # ordered, its spawn not written yet
        broker.subscribe(Spawn, self._order)
        broker.subscribe(Kill, self._order)

    def log_paths(self, job_id: int) -> tuple[Path, Path]:
        return self.logs_dir / f"{job_id}.out", self.logs_dir / f"{job_id}.err"

    def rss_mb(self, job_id: int) -> int:
        p = self.procs.get(job_id)
        return p.rss_mb if p else 0

    def live_rss(self, job_id: int) -> tuple[int, int, int] | None:
        """(RSS now, peak so far, peak VRAM so far) of a running attempt's tree."""
        p = self.procs.get(job_id)
        return (p.rss_mb, p.peak_rss_mb, p.peak_vram_mb) if p else None

    def _order(self, order: Spawn | Kill) -> None:
        """An engine order, carried out in a task of its own (started here, at once:
        no hand-over through a stream)."""
        if self._tasks is None:
            self._early.append(order)
        elif isinstance(order, Spawn):
            # In order: the spawn in front (if any) was ordered before it, and a spawn may
            # be claimed behind any, even one still to be sent (core/table.line_of).
            front = self._sending.get(order.after[0]) if order.after is not None else None
            self._sending[order.job.id] = Sending(front)
            self._tasks.start_soon(self.launch, order)
        else:
            self._tasks.start_soon(self.kill, order)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        tasks = Tasks()
        for p in self._adopted:
            tasks.start_soon(self._watch, p)
        self._adopted.clear()
        self._tasks = tasks
        for order in self._early:
            self._order(order)
        self._early.clear()
        task_status.started()
        try:
            await tasks.run()
        finally:
            self._tasks = None

    def _launch_spec(self, job: Job, n: int, cards: tuple[int, ...]) -> Spec:
        user_env, uid, gid, groups = user_of(job.spec.owner_uid)
        env = apply_visibility({**job.spec.env, **user_env}, self.monitor.visibility_env(cards))
        env["GPUSV_JOB_ID"] = str(job.id)
        env["GPUSV_ATTEMPT"] = str(n)
        if self.cfg.logs.python_unbuffered:  # so that `logs -f` is live for Python jobs
            env.setdefault("PYTHONUNBUFFERED", "1")
        if job.spec.array_id is not None:
            env["GPUSV_ARRAY_ID"] = str(job.spec.array_id)
            env["GPUSV_ARRAY_INDEX"] = str(job.spec.array_index)
        if n > 1:  # where one attempt's output ends and the next one's starts
            out, err = self.log_paths(job.id)
            joblogs.write_header(out, err, joblogs.header(job.id, n, now_iso()))
        # log_paths' and index_of's names as strings, without a Path each (8 us a job)
        base = os.path.join(self._logs_str, str(job.id))
        limit = job.spec.mem_mb if self.cfg.host_memory.enforce_declared else None
        return Spec(
            job=job.id,
            attempt=n,
            argv=job.spec.argv,
            cwd=job.spec.cwd,
            env=env,
            stdout=base + ".out",
            stderr=base + ".err",
            uid=uid,
            gid=gid,
            groups=groups,
            oom_score_adj=ranking.NEWEST,
            mem_max=limit and limit * 2**20,
            index=base + ".idx",
        )

    async def launch(self, order: Spawn) -> None:
        """Start the process unless the engine has given the attempt up meanwhile (a
        cancel before the start); then wait for it and report its end."""
        sending = self._sending.get(order.job.id)
        try:
            p = await self._start(order, sending)
        finally:
            if sending is not None:
                sending.over.set()
                del self._sending[order.job.id]
        if p is not None:
            await self._watch(p)

    async def _start(self, order: Spawn, sending: Sending | None) -> Proc | None:
        job_id, n = order.job.id, order.attempt.n
        await self.engine.do(Spawning(job_id, n))
        live = self.engine.table.live.get(job_id)
        if live is None or live.attempt.n != n or live.phase is not Phase.SPAWNING:
            return None
        name = keeper_name(order.cards)
        ahead = None
        if order.after is not None:
            ahead = self._ahead[job_id] = Ahead(order.after)
        try:
            spec = self._launch_spec(order.job, n, order.cards)
            grace = self.cfg.jobs.kill_grace_s
            drop = ahead.drop if ahead else None
            try:
                if sending is not None and not await sending.front_sent():
                    raise SpawnDropped("the spawn in front of it never reached its keeper")
                written = sending.written if sending else None
                handle = await self.keepers.spawn(name, spec, order.after, drop, grace, written)
            finally:
                if ahead is not None:
                    ahead.answered.set()
                    self._ahead.pop(job_id, None)
        except SpawnError as exc:
            if exc.kind is not None:  # the operator's to fix, not the job's
                log.error(
                    "job not started",
                    job_id=job_id,
                    attempt=n,
                    keeper=name,
                    kind=exc.kind,
                    why=str(exc),
                )
            facts = Facts(
                None, spawn_error=str(exc), spawn_transient=exc.transient, spawn_kind=exc.kind
            )
            await self.engine.do(Ended(job_id, n, facts))
            await self.keepers.forget(name, (job_id, n))
            return None
        except SpawnDropped as exc:
            await self._dropped(job_id, n, name, exc)
            return None
        p = Proc(job_id, n, order.cards, order.seq, time.monotonic(), handle)
        p.oom_score_adj = spec.oom_score_adj  # set by the keeper before exec
        if handle.record.memcg is None:  # a v1 memory cgroup of its own counts its kills
            p.oom_kills_at_start = self.evidence.oom_kills_now()
        self.procs[job_id] = p
        front = self.procs.get(order.after[0]) if order.after is not None else None
        if front is not None and (front.job_id, front.n) == order.after:
            front.leader_ended = True  # its keeper started this one only after its exit
        self.ranks.started(p)
        await self.engine.do(Started(job_id, n, handle.pid, handle.start_time))
        return p

    async def _dropped(self, job_id: int, n: int, name: str, exc: SpawnDropped) -> None:
        """A spawn started ahead that never ran: its end has no process (the engine adds
        why, if it stopped it; else it is `interrupted`, charged to no budget)."""
        if exc.gone:  # nothing of it may run on unseen, whatever the keeper had done
            home = self.keepers.home(name)
            with contextlib.suppress(Exception):
                await self.abort(lambda: kill_through(home, (job_id, n), 0.0), f"job-{job_id}")
        log.info("start ahead dropped", job_id=job_id, attempt=n, why=str(exc))
        await self.engine.do(Ended(job_id, n, Facts(None)))

    def adopt(
        self, job_id: int, n: int, cards: tuple[int, ...], seq: int, proc: KeptProcess
    ) -> None:
        """An attempt an earlier daemon started, taken back from its keeper (recovery)."""
        p = Proc(job_id, n, cards, seq, time.monotonic(), proc)
        self.procs[job_id] = p
        self.ranks.known = False  # its value is not known here: the next start ranks all
        self._adopted.append(p)

    async def _watch(self, p: Proc) -> None:
        """Wait for the attempt's end as its keeper recorded it, report it, then let the
        keeper forget it (only once the end is committed here)."""
        try:
            try:
                status = await p.handle.wait()
            except KeeperGone:
                status = None
            if status is None:  # its keeper died: the job was killed, its status unknown
                await self._keeper_lost(p)
                status = ExitStatus(None, signal.SIGKILL)
            await self.end(p, status)
            await self._forget(p)
        finally:
            self.procs.pop(p.job_id, None)

    async def _keeper_lost(self, p: Proc) -> None:
        """Its keeper died, which killed the job (the next keeper kills what is left):
        `interrupted`, the keeper named, and an attempt of the job's budget spent."""
        keeper = p.handle.keeper
        log.warning(
            "keeper died: its job was killed", job_id=p.job_id, keeper=keeper.name, pid=keeper.pid
        )
        evidence = keeper_death(keeper.name, keeper.pid)
        await self.engine.do(Stop(p.job_id, FailureReason.INTERRUPTED, evidence))

    async def _forget(self, p: Proc) -> None:
        if p.handle.key in p.handle.keeper.settled:  # acknowledged once its keeper answers
            return
        with contextlib.suppress(KeeperError, KeeperGone, OSError):
            if p.handle.keeper.gone:  # a new keeper took the journal over: ack there
                p.handle.keeper, _ = await self.keepers.ensure(p.handle.keeper.name)
            await p.handle.ack(answered=False)

    async def end(self, p: Proc, status: ExitStatus) -> None:
        """Gather the facts of the end, kill leftovers, and hand the facts to the engine."""
        hang, machine = None, None
        live = self.engine.table.live.get(p.job_id)
        killed = live is not None and live.kill is not None  # its reason is known
        if classify_exit(status) is not None and p.cards and not killed:
            hang = self.evidence.hang_evidence(p.cards, p.started_mono)
            if hang is None:
                hang = await self.evidence.wait_for_fault(p.cards, p.started_mono)
            if hang is not None:  # stamped when the line came, not now
                machine = {
                    **self.evidence.machine(p.cards[0]),
                    "at": (hang.get("at") or [None])[-1],
                }
        ended = p.handle.ended
        oom_why = self.evidence.oom_evidence(p, status, ended.oom_kills if ended else None)
        if may_have_leftovers(ended) and p.handle.tree():  # descendants outlived the leader
            handle = p.handle
            with contextlib.suppress(Exception):
                await self.abort(lambda: handle.kill_tree(0.5), f"job-{p.job_id}-leftovers")
        unstarted = never_ran(ended)
        facts = Facts(
            None if unstarted else status,
            spawn_error=unstarted,
            hang=hang,
            oom=oom_why,
            peak_rss_mb=peak_mb(p.peak_rss_mb, ended.peak_bytes if ended else None),
            peak_vram_mb=p.peak_vram_mb,
            machine=machine,
            exited_at=ended.ended_at if ended else None,
            output_dropped=ended.output_dropped if ended else 0,
        )
        await self.engine.do(Ended(p.job_id, p.n, facts))
        self.procs.pop(p.job_id, None)
        self.ranks.ended(p.job_id)

    async def kill(self, order: Kill) -> None:
        """Kill an attempt's tree (then re-probe its card after a hang), all on one abort
        thread under the deadman; the attempt's watcher reports the end."""
        p = self.procs.get(order.job_id)
        if p is None and order.job_id in self._ahead:  # its keeper drops it, or kills it
            self._ahead[order.job_id].drop.ask()  # if it has just started (Started kills)
            return
        if p is None or p.aborting:
            return
        p.aborting = True
        if order.reprobe is not None:
            await self._drop_behind(order.job_id)
        handle, grace, card = p.handle, self.cfg.jobs.kill_grace_s, order.reprobe
        if order.since is not None:  # a stop begun before a restart: its grace goes on
            grace = max(0.0, grace - (time.time() - order.since))
        backend = self.monitor.backend

        settled: list[bool] = []

        def abort() -> None:
            settled.append(handle.kill_tree(grace))
            if card is not None:
                backend.query(card)

        if card is not None:
            self.monitor.recovering.add(card)
            self.monitor.on_change()
        try:
            with contextlib.suppress(Exception):  # a failed re-probe is the monitor's to see
                await self.abort(abort, f"job-{p.job_id}")
            if settled and settled[0] and handle.ended is None:  # its keeper is silent: ours
                handle.keeper.settle(ended_by_gpusvd(handle.record, time.time()))
        finally:
            if card is not None:
                self.monitor.recovering.discard(card)
                self.monitor.on_change()

    def drop_ahead(self, job_ids: list[int]) -> None:
        """Ask the keepers to drop these jobs' parked spawns now, before their Stops are
        recorded: dropping what never ran needs no write (its end comes as `dropped`)."""
        for job_id in job_ids:
            ahead = self._ahead.get(job_id)
            if ahead is not None:
                ahead.drop.ask()

    async def _drop_behind(self, job_id: int) -> None:
        """Before a hung job is killed, what its keeper holds back to start behind it is
        dropped, and answered: the keeper would otherwise start it the moment the hung
        job dies, on the card about to be re-probed (the engine queues it again)."""
        line = behind(self._ahead, job_id)  # whole (its keeper drops it so too)
        for a in line:
            a.drop.ask()
        await answers(line)

    async def ahead_answered(self) -> None:
        """Every held-back spawn answered: a drain stops those first, else the keeper
        starts one the moment the job in front dies, before the drop reaches it."""
        await answers(list(self._ahead.values()))

    def running_json(self) -> list[dict[str, Any]]:
        """The running attempts' processes, for a forensics report."""
        out = []
        for p in list(self.procs.values()):
            pids = [q.pid for q in p.handle.tree()]
            out.append({"job_id": p.job_id, "pids": pids, "gpus": list(p.cards)})
        return out

    def kill_all_now(self) -> None:
        """A second stop signal: no grace for anyone."""
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                p.handle.signal_tree(signal.SIGKILL)
