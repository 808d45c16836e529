"""A running attempt's handle: its leader, kept by a keeper, reached over the keeper's
socket (pid, start time, wait, kill, its processes). The processes are the keeper's
children, never gpusvd's."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import structlog

from supervisor.core.jobs import ExitStatus
from supervisor.daemon.running.keeper_link import CALL_DEADLINE_S
from supervisor.keeper import pidfds
from supervisor.keeper.cgroup import Groups, kill_all, orphan_pids, signal_groups
from supervisor.keeper.client import Connection, KeeperError
from supervisor.keeper.journal import Key, Record

if TYPE_CHECKING:
    from supervisor.daemon.running.keeper_calls import Keeper

log = structlog.get_logger("gpusvd.keepers")


def exit_status(record: Record) -> ExitStatus | None:
    """The leader's status as the runner reports it; None for a `lost` record."""
    if record.wait_status is not None:
        return ExitStatus.from_wait_status(record.wait_status)
    return None


def never_ran(record: Record | None) -> str | None:
    """Why an attempt answered as started before its exec (a gated start that waited:
    keeper/server.py, EXEC_ANSWER_S) never ran its command: its end's error. None for
    any other end, a lost one's included (its error tells of a damaged journal)."""
    if record is None or record.lost:
        return None
    return record.error or None


@dataclass
class KeptProcess:
    """A job's leader, kept by a keeper, reached over the keeper's socket.

    The synchronous methods (tree, signal_tree, kill_tree) serve callers on worker and
    abort threads: they read the job's cgroup themselves, and a kill opens a connection
    of its own."""

    keeper: Keeper
    record: Record
    ended: Record | None = None

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def start_time(self) -> float:
        return self.record.started_at

    @property
    def key(self) -> Key:
        return self.record.key

    @property
    def known(self) -> dict[int, psutil.Process]:
        """The job's processes as its cgroup lists them (the sampler's seeds)."""
        return {proc.pid: proc for proc in self.tree()}

    @property
    def leader(self) -> psutil.Process | None:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.start_time) < 1.0:
                return proc
        return None

    def pids_now(self) -> list[int]:
        """From cgroup.procs (v2, else v1 memory): no /proc scan, no escape. Without a
        cgroup: the leader's tree, and what its keeper was left of it (escapees that
        kept their tag, once their parent died; see keeper/cgroup.py's orphan_pids)."""
        for path in (self.record.cgroup, self.record.memcg):
            if path:
                try:
                    return [int(p) for p in _read_all(f"{path}/cgroup.procs").split()]
                except (OSError, ValueError):
                    continue
        pids: list[int] = []
        leader = self.leader
        if leader is not None:
            with contextlib.suppress(psutil.Error):
                pids = [self.pid, *(c.pid for c in leader.children(recursive=True))]
        if self.keeper.pid:
            found = orphan_pids(self.keeper.pid, *self.key)
            pids += [p for p in found if p not in pids and (p != self.pid or leader)]
        return pids

    def tree(self, table: object = None) -> list[psutil.Process]:
        procs = []
        for pid in self.pids_now():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    procs.append(proc)
        return procs

    def remember(self, pids: object) -> None:
        """The cgroup remembers for us."""

    def signal_tree(self, sig: int) -> None:
        """Each process through a pidfd, once it holds the pid: still in the job's
        cgroup, or, without one, still started when the pid was read (pidfds.py)."""
        groups = Groups(self.record.cgroup or None, self.record.memcg or None)
        if groups.any:
            signal_groups(groups, sig)
        else:
            pidfds.signal_started(self.pids_now(), sig)

    def kill_tree(self, grace_s: float) -> bool:
        """Blocking, for an abort thread: SIGTERM and SIGCONT, SIGKILL after the grace;
        returns once every process of the job is gone (the keeper answers then). True
        when gpusvd did it itself, its keeper not answering (keeper_watch.py): SIGTERM
        at once, the job's cgroup killed after the grace; the keeper, stopped, cannot
        record the end, so the caller does (Keeper.settle)."""
        began = time.monotonic()

        def silent() -> bool:
            return self.keeper.silent_since is not None

        if kill_through(self.keeper.home, self.key, grace_s, give_up=silent):
            return False
        if not silent():
            self.signal_tree(signal.SIGKILL)
            return False
        log.warning(
            "keeper not answering: stopping its job through its cgroup",
            keeper=self.keeper.name,
            job_id=self.key[0],
            attempt=self.key[1],
        )
        left = grace_s - (time.monotonic() - began)
        if left > 0:
            self.signal_tree(signal.SIGTERM)
            self.signal_tree(signal.SIGCONT)
            _until(lambda: not self.tree(), left)
        groups = Groups(self.record.cgroup or None, self.record.memcg or None)
        while self.tree() and time.monotonic() - began < grace_s + CALL_DEADLINE_S:
            if groups.any:
                kill_all(groups)  # cgroup.kill where v2 has it: the whole job at once
            else:
                self.signal_tree(signal.SIGKILL)
            time.sleep(0.01)
        return not self.tree()

    async def wait(self) -> ExitStatus | None:
        """The leader's status once its end is on the keeper's disk; None when the keeper
        found it orphaned (`lost`: killed, true status unknown). Raises KeeperGone if the
        keeper dies first."""
        self.ended = await self.keeper.ended(self.key)
        return exit_status(self.ended)

    async def kill(self, grace_s: float) -> None:
        await self.keeper.call("kill", job=self.key[0], attempt=self.key[1], grace_s=grace_s)

    async def pids(self) -> list[int]:
        answer = await self.keeper.call("procs", job=self.key[0], attempt=self.key[1])
        return [int(pid) for pid in answer["pids"]]

    async def memory(self) -> tuple[int | None, int | None]:
        """(peak bytes, OOM kills) from the job's own cgroup: the kernel's figures."""
        answer = await self.keeper.call("memory", job=self.key[0], attempt=self.key[1])
        return answer["peak_bytes"], answer["oom_kills"]

    async def ack(self, *, answered: bool = True) -> None:
        """The end is committed: the keeper may forget the record and the cgroups. With
        answered=False the answer is not waited for (a record left unacknowledged is
        served again to the next attach, and acknowledged then)."""
        if answered:
            await self.keeper.call("ack", job=self.key[0], attempt=self.key[1])
        else:
            await self.keeper.tell("ack", job=self.key[0], attempt=self.key[1])


def kill_through(
    home: Path, key: Key, grace_s: float, give_up: Callable[[], bool] | None = None
) -> bool:
    """Blocking: the keeper kills the attempt (or drops it, if it holds it back) and
    answers once nothing of it is left; False if the keeper could not be asked, or, with
    `give_up`, once that says to stop waiting for its answer."""
    try:
        with Connection(home / "sock", timeout_s=grace_s + CALL_DEADLINE_S) as conn:
            rid = conn.send("kill", job=key[0], attempt=key[1], grace_s=grace_s)
            if give_up is not None:
                deadline = time.monotonic() + grace_s + CALL_DEADLINE_S
                while not select.select([conn.sock], [], [], 0.05)[0]:
                    if give_up():
                        return False
                    if time.monotonic() > deadline:
                        raise TimeoutError("no answer to kill")
            answer = conn.reply(rid)
            if not answer.get("ok"):
                raise KeeperError.of(answer)
    except (OSError, ConnectionError, KeeperError) as exc:  # a timeout is an OSError
        log.warning("kill through the keeper failed", job_id=key[0], error=repr(exc))
        return False
    return True


def _until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def ended_by_gpusvd(record: Record, at: float) -> Record:
    """The end gpusvd records for an attempt it killed itself, its keeper not answering:
    killed by SIGKILL (the true status is the keeper's to learn, once it answers)."""
    return dataclasses.replace(
        record, ended_at=at, wait_status=signal.SIGKILL, signal=signal.SIGKILL
    )


def _read_all(path: str) -> bytes:
    """A kernel file, with os calls only: read at each dispatch (oom_score_adj ranking),
    where pathlib's read_text of a cgroup.procs took 10 µs here, this 2.4 µs."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
