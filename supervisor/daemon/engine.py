"""The engine: the only writer of job state.

`do(command)` runs the pure step (core/engine.py) on the table, commits its writes in
one transaction (raising if they did not commit), applies its changes to the table, and
publishes its actions on the broker, where the services that perform them listen.
Commands are taken one turn at a time, so every step sees the table as committed. The
daemon's own commands (an end, a start, a pass's claims) that arrive while a turn is
under way are taken together in the next one: stepped in order in one draft (each sees
what those before it changed), committed in one transaction, applied, and their actions
published in order. A client's command (whose write may be refused: the client hears
`storage`) has a turn to itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import anyio
import structlog

from supervisor.core.commands import (
    Command,
    InsertJob,
    Now,
    Recover,
    SaveJob,
    SetPid,
    SubmitJobs,
    Write,
)
from supervisor.core.dependencies import expanded, newest_per_index, parents
from supervisor.core.draft import Step
from supervisor.core.engine import steps
from supervisor.core.jobs import JobSpec, JobState
from supervisor.core.table import Table
from supervisor.daemon.broker import Broker
from supervisor.daemon.event_log import JobLines
from supervisor.daemon.store.commit import commit, commit_later
from supervisor.daemon.store.database import StorageError, Store

log = structlog.get_logger("gpusvd.engine")
T = TypeVar("T")
ALL_OF_AN_ARRAY = 10_000_000  # every job an array has had, restarts included
PID_HOLD_S = 0.05  # the longest a started attempt's pid waits for its end to carry it


def now() -> Now:
    return Now(time.time(), time.monotonic())


@dataclass
class _Queued:
    """A command waiting for its turn; `out` once a turn took it, or `error`."""

    cmd: Command
    out: Step | None = None
    error: BaseException | None = None


class TurnLost(RuntimeError):
    """The turn that took this command was cancelled: it may or may not have landed."""


class Engine:
    def __init__(
        self,
        store: Store,
        broker: Broker,
        clock: Callable[[], Now] = now,
        lines: JobLines | None = None,
    ) -> None:
        self.store = store
        self.broker = broker
        self.clock = clock
        self.lines = lines or JobLines()  # the events' log lines, once committed
        self.table = Table()
        self.epoch = 0  # +1 when a commit starts and when it ends
        # One turn at a time; asyncio's lock takes no turn of the loop when free, and its
        # release does not look up the current task to check the owner, as anyio's does
        # (two locks a command: 1.5 % of the daemon's CPU in a batch).
        self._turn = asyncio.Lock()
        self._queued: list[_Queued] = []  # the daemon's own commands, for the next turn
        self._pids: dict[tuple[int, int], SetPid] = {}  # started attempts' pids, held
        self._pid_timer: asyncio.TimerHandle | None = None
        store.on_settle(self.release_pids)

    async def do(self, cmd: Command) -> Step:
        """Decide, commit, apply, act; returns the step (its writes name new job ids; a
        command taken with others returns their turn's step).

        A command sent while answering a client fails at once (StorageError) when the
        database is known not to take writes: it is not queued behind patient ones."""
        answering = self.store.is_answering()
        if self.store.problem is not None and answering:
            raise StorageError("not writable now", self.store.problem)
        if answering or isinstance(cmd, SubmitJobs):
            async with self._turn:
                if isinstance(cmd, SubmitJobs):
                    cmd = await self._with_parents(cmd)
                request = cmd.request_id if isinstance(cmd, SubmitJobs) else None
                return await self._take((cmd,), request)
        mine = _Queued(cmd)
        self._queued.append(mine)
        try:
            await self._turn.acquire()
        except BaseException:  # cancelled while it waited: not taken, nor to be
            if mine in self._queued:
                self._queued.remove(mine)
            raise
        try:
            if mine.out is None and mine.error is None:  # no earlier turn took it
                batch, self._queued = self._queued, []
                try:
                    out = await self._take(tuple(q.cmd for q in batch))
                except BaseException as exc:
                    lost = TurnLost("the engine's turn was cancelled")
                    cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
                    for q in batch:
                        q.error = lost if cancelled and q is not mine else exc
                    raise
                for q in batch:
                    q.out = out
        finally:
            self._turn.release()
        if mine.error is not None:
            raise mine.error
        assert mine.out is not None
        return mine.out

    async def _take(self, cmds: tuple[Command, ...], request: str | None = None) -> Step:
        out = steps(self.table, cmds, self.clock())
        writes = out.writes
        if not any(isinstance(c, Recover) for c in cmds):
            writes = self._hold_pids(writes)
        if writes:
            # The end of an attempt whose pid is held records the pid with it (one
            # UPDATE of its attempt, one of its job): the held write is not needed.
            ends = {k for w in writes if (k := _ended(w)) is not None}
            taken = {k: self._pids.pop(k) for k in ends & self._pids.keys()}
            self.epoch += 1  # odd: a commit is in flight
            try:
                await commit(self.store, writes, request)
            except BaseException:
                self._pids.update(taken)  # not recorded: still to be
                raise
            finally:
                self.epoch += 1
        self.table.apply(out.changes)
        self._announce(out)
        return out

    def _hold_pids(self, writes: list[Write]) -> list[Write]:
        """A started attempt's pid (the keeper's journal has it) is held, not committed
        with its turn: a short job's end records it (no statements of its own), and
        what is left of them after PID_HOLD_S rides along with the next commit."""
        rest: list[Write] = [w for w in writes if not isinstance(w, SetPid)]
        if len(rest) == len(writes):
            return writes
        for w in writes:
            if isinstance(w, SetPid):
                self._pids[(w.attempt.job_id, w.attempt.n)] = w
        if self._pid_timer is None:
            loop = asyncio.get_running_loop()
            self._pid_timer = loop.call_later(PID_HOLD_S, self.release_pids)
        return rest

    def release_pids(self) -> None:
        """The held pids go to the store's writer, to ride along with its next commit
        (at once: a reader that must see them calls this, then the store's settle)."""
        if self._pid_timer is not None:
            self._pid_timer.cancel()
            self._pid_timer = None
        if self._pids:
            held, self._pids = list(self._pids.values()), {}
            commit_later(self.store, held)

    def _announce(self, out: Step) -> None:
        """What follows a commit: its log lines, then its actions. Nothing here raises:
        the turn is committed, and its callers are told so (the broker isolates each
        listener; a fault in the lines is logged), never an error that would have a
        client retry what was done, nor a daemon stopped with a job claimed."""
        if out.writes and not all(isinstance(w, SetPid) for w in out.writes):
            try:
                self.lines.log(out.writes)
            except Exception:
                log.exception("job lines not logged")
        for action in out.actions:
            self.broker.publish(action)

    async def read(self, reader: Callable[[], Awaitable[T]], tries: int = 5) -> T:
        """What `reader` reads of the table and the store at one moment: read again while
        a commit was in flight or one landed meanwhile (a few times at most)."""
        for _ in range(tries - 1):
            before = self.epoch
            value = await reader()
            if before == self.epoch and before % 2 == 0:
                return value
        return await reader()

    async def _with_parents(self, cmd: SubmitJobs) -> SubmitJobs:
        """Parents of an array spelled out, and the end of those no longer active, read
        from the store while no command runs, so none can end (nor an index be rerun)
        unseen in between."""
        arrays = await self._arrays(cmd.specs)
        ended: dict[int, JobState] = {}
        for spec in cmd.specs:
            for parent in parents(expanded(spec, arrays)):
                if parent not in self.table.jobs and parent not in ended:
                    row = await self.store.get_job(parent)
                    ended[parent] = row.state if row is not None else JobState.FAILED
        if not ended and not arrays:
            return cmd
        return replace(cmd, ended_parents=ended, arrays=arrays)

    async def _arrays(self, specs: Sequence[JobSpec]) -> dict[int, tuple[int, ...]]:
        """Each parent that is a job of an array -> the newest job of each of its indices."""
        found: dict[int, tuple[int, ...]] = {}
        members: dict[int, tuple[int, ...]] = {}
        seen: set[int] = set()
        for spec in specs:
            for parent in parents(spec):
                if parent in seen:
                    continue
                seen.add(parent)
                job = self.table.jobs.get(parent) or await self.store.get_job(parent)
                array = None if job is None else job.spec.array_id
                if array is None:
                    continue
                if array not in members:
                    rows = await self.store.list_jobs((), ALL_OF_AN_ARRAY, None, array)
                    members[array] = newest_per_index((j.id, j.spec.array_index) for j in rows)
                found[parent] = members[array]
        return found


def _ended(w: Write) -> tuple[int, int] | None:
    """The attempt (job, n) whose end the write records, if it records one."""
    if isinstance(w, SaveJob) and w.ended_attempt is not None:
        return (w.job.id, w.ended_attempt.n)
    return None


def submitted_ids(out: Step) -> list[int]:
    """The ids a SubmitJobs step gave its jobs, in order."""
    return [w.job.id for w in out.writes if isinstance(w, InsertJob)]
