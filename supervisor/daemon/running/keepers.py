"""gpusvd's side of the keepers: start them, spawn through them, take their jobs back.

One `Keeper` per keeper directory (`<state>/keepers/<name>`), one connection each,
attached: a newer gpusvd's attach closes an older one's connection, and every exit is
pushed to us once it is on the keeper's disk. A running attempt's handle is a
`KeptProcess` (handles.py); the calls on one keeper are keeper_calls.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.daemon.running import keeper_link as link
from supervisor.daemon.running.handles import KeptProcess
from supervisor.daemon.running.keeper_calls import RELIST_S as RELIST_S
from supervisor.daemon.running.keeper_calls import Drop as Drop
from supervisor.daemon.running.keeper_calls import Keeper as Keeper
from supervisor.daemon.running.keeper_calls import KeeperGone as KeeperGone
from supervisor.daemon.running.keeper_calls import SpawnDropped as SpawnDropped
from supervisor.daemon.running.keeper_watch import SILENT_AFTER_S, KeeperWatch
from supervisor.daemon.running.keeper_wire import Wire
from supervisor.daemon.running.launch import SpawnError
from supervisor.keeper.client import Connection, KeeperError, launch
from supervisor.keeper.journal import Key, Record, record_from
from supervisor.keeper.spawn import Spec

log = structlog.get_logger("gpusvd.keepers")


def keeper_name(cards: tuple[int, ...]) -> str:
    """One keeper per card (a job on several cards goes to its first), one for CPU slots:
    a keeper that dies costs one card's jobs, and one card's spawns never wait on
    another's."""
    return f"gpu{cards[0]}" if cards else "cpu"


def cgroup_tag(state_dir: Path) -> str:
    """The directory that holds this daemon's job cgroups: stable across restarts, and
    distinct for two daemons on one host (their state dirs differ)."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"gpusv-{digest}"


class Keepers:
    """The keepers of one state dir, used inside `async with`: each connection's reader
    runs in this object's own task group."""

    def __init__(
        self,
        state_dir: Path,
        cgroup2: Path | None = None,
        memcg: Path | None = None,
        *,
        silent_after_s: float = SILENT_AFTER_S,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = state_dir / "keepers"
        self.cgroup2, self.memcg = cgroup2, memcg
        self.keepers: dict[str, Keeper] = {}
        # keeper -> why its last start was refused for want of a cgroup (until one works)
        self.cgroup_trouble: dict[str, str] = {}
        # keeper -> why it could not be attached at start (keeper_watch tries it again)
        self.unreached: dict[str, str] = {}
        # An attach answers at the keeper's next journal sync: twice the silence limit
        # is a keeper that does not answer (and at start, one whose jobs are let go).
        self.attach_deadline_s = 2 * silent_after_s
        # One keeper's start at a time, each keeper on its own: the cards' keepers start
        # side by side (a keeper's start is an interpreter's, 0.15-0.3 s of its first job)
        self._starting: dict[str, anyio.Lock] = {}
        self.watch = KeeperWatch(
            lambda: self.keepers,
            silent_after_s=silent_after_s,
            on_change=on_change,
            unreached=lambda: self.unreached,
            reach=self.reach_again,
        )

    async def __aenter__(self) -> Keepers:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for keeper in self.keepers.values():  # the connections; the keepers live on
            keeper.closing = True
            keeper.wire.close()

    def problems(self, now: float) -> list[str]:
        """For `gpusv health`: keepers that do not answer, and keepers whose jobs are
        refused for want of a cgroup."""
        refused = [
            f"keeper {name}: jobs not started: {why}"
            for name, why in sorted(self.cgroup_trouble.items())
        ]
        return self.watch.problems(now) + refused

    def state(self, name: str) -> str | None:
        """A keeper as `gpusv gpus` shows it: "ok", "not answering", or None (none
        started, or it died and none has been started since)."""
        if name in self.unreached:
            return "not answering"
        keeper = self.keepers.get(name)
        if keeper is None or keeper.gone:
            return None
        return "not answering" if keeper.silent_since is not None else "ok"

    def home(self, name: str) -> Path:
        return self.root / name

    def roots(self, name: str) -> tuple[Path | None, Path | None]:
        """Each keeper's own cgroup roots: a keeper that starts kills strays in its roots,
        so no two keepers may share one."""
        return (
            None if self.cgroup2 is None else self.cgroup2 / f"keeper-{name}",
            None if self.memcg is None else self.memcg / f"keeper-{name}",
        )

    async def ensure(self, name: str) -> tuple[Keeper, list[Record]]:
        """The named keeper, started if none serves its directory, attached; with every
        record it holds (running, and ended but not yet acknowledged)."""
        keeper = self.keepers.get(name)
        if keeper is not None and not keeper.gone:  # every spawn asks: no lock to take
            return keeper, []
        starting = self._starting.get(name)
        if starting is None:
            starting = self._starting[name] = anyio.Lock(fast_acquire=True)
        async with starting:
            keeper = self.keepers.get(name)
            if keeper is not None and not keeper.gone:
                return keeper, []
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            home = self.home(name)
            v2, v1 = self.roots(name)
            await anyio.to_thread.run_sync(launch, home, v2, v1)
            keeper = await _connect(name, home)
            try:
                answer = await keeper.call("attach", deadline_s=self.attach_deadline_s)
            except BaseException:  # not kept: its connection neither
                keeper.closing = True
                keeper.wire.close()
                raise
            keeper.pid = int(answer["pid"])
            keeper.pidfd = link.open_pidfd(keeper.pid)
            keeper.features = frozenset(answer.get("features") or ())
            if answer.get("damaged"):  # said by the keeper too, in its own log
                log.error("keeper journal damaged", keeper=name, lines=answer["damaged"][:20])
            records = [record_from(r) for r in answer["jobs"]]
            for record in records:
                if record.ended:
                    keeper._exited(record)
            self.keepers[name] = keeper
            log.info("keeper attached", keeper=name, pid=keeper.pid, records=len(records))
            return keeper, records

    async def spawn(
        self,
        name: str,
        spec: Spec,
        after: Key | None = None,
        drop: Drop | None = None,
        grace_s: float = 0.0,
        written: Callable[[], None] | None = None,
    ) -> KeptProcess:
        """Start the job through the named keeper; with `after`, once that attempt (of the
        same keeper) has exited, unless `drop` is asked first. `written` is called once
        the request is on the keeper's connection. Raises SpawnError with a readable
        reason (including when no keeper can be started), SpawnDropped for a spawn after
        another that never ran."""
        fields = _spawn_fields(spec)
        if after is not None:
            fields["after"] = {"job": after[0], "attempt": after[1]}
        try:
            keeper, _ = await self.ensure(name)
            drop = drop if after else None
            answer = await keeper.call(
                "spawn", drop=drop, drop_grace_s=grace_s, written=written, **fields
            )
        except KeeperError as exc:
            if exc.code == "dropped":
                raise SpawnDropped(exc.message) from None
            if exc.code == "cgroup":  # never run outside its cgroup: said to the operator
                self.cgroup_trouble[name] = exc.message
                raise SpawnError(exc.message, kind="cgroup") from None
            message = exc.message if exc.code == "spawn" else str(exc)
            raise SpawnError(message, transient=_passing(exc)) from None
        except (KeeperGone, OSError) as exc:
            if after is not None:  # a held-back spawn goes with its connection
                raise SpawnDropped(f"keeper {name} went away: {exc}", gone=True) from None
            raise SpawnError(f"keeper {name} unavailable: {exc}", transient=True) from None
        record = record_from(answer["job"])
        if record.cgroup or record.memcg:
            self.cgroup_trouble.pop(name, None)
        return KeptProcess(keeper, record)

    async def forget(self, name: str, key: Key) -> None:
        """Let the keeper drop a record whose end is committed here, if it holds one: an
        exec that failed leaves one, with no process to watch (its answer is not needed:
        a record still held is served again at the next attach)."""
        keeper = self.keepers.get(name)
        if keeper is not None and not keeper.gone:
            with contextlib.suppress(KeeperGone):
                await keeper.tell("ack", job=key[0], attempt=key[1])

    def can(self, name: str, feature: str) -> bool:
        """Whether the named keeper, attached now, announced `feature` (a keeper started
        by an older gpusvd may not have it)."""
        keeper = self.keepers.get(name)
        if keeper is None or keeper.gone or keeper.silent_since is not None:
            return False  # one that does not answer is given nothing to start ahead
        return feature in keeper.features

    def adopt(self, keeper: Keeper, record: Record) -> KeptProcess:
        """A record from `ensure` (a job started by an earlier gpusvd) as a process."""
        return KeptProcess(keeper, record)

    async def ensure_all(self) -> dict[Key, KeptProcess]:
        """Every keeper that has a directory here, started if it died, attached: every
        record they hold, as processes. Called before anything is dispatched."""
        found: dict[Key, KeptProcess] = {}
        names = (
            sorted(p.name for p in self.root.glob("*") if p.is_dir()) if self.root.exists() else []
        )
        for name in names:
            home = self.home(name)
            journal = home / "journal"
            if not (home / "sock").exists() and not (journal.exists() and journal.stat().st_size):
                continue  # left empty by a keeper that was let go: nothing to take back
            try:
                keeper, records = await self.ensure(name)
            except (KeeperError, KeeperGone, OSError) as exc:
                # One keeper that does not answer (stopped, wedged) must not keep gpusvd
                # from starting: its attempts are closed `interrupted` (recovery kills
                # what it finds of them), its card waits until it answers (reach_again).
                self.unreached[name] = str(exc)
                log.error(
                    "keeper not answering at start: its jobs are not taken back, its card "
                    "takes no new jobs until it answers",
                    keeper=name,
                    error=str(exc),
                )
                continue
            for record in records:
                found[record.key] = KeptProcess(keeper, record)
        return found

    async def reach_again(self, name: str) -> None:
        """A keeper that did not answer at start, tried again (keeper_watch): once it
        answers a ping, attached, and whatever it holds let go, each record's attempt
        having been closed at start (what still runs of it is killed first)."""
        home = self.home(name)
        if await anyio.to_thread.run_sync(_answers, home) is False:
            return  # it lives and still does not answer (None: none serves; one is started)
        try:
            keeper, records = await self.ensure(name)
            for record in records:
                if not record.ended:
                    await keeper.call("kill", job=record.job, attempt=record.attempt, grace_s=0.0)
                await keeper.tell("ack", job=record.job, attempt=record.attempt)
        except (KeeperError, KeeperGone, OSError) as exc:
            self.unreached[name] = str(exc)
            return
        self.unreached.pop(name, None)
        log.warning("keeper answers again: attached", keeper=name, let_go=len(records))
        self.watch.on_change()

    async def shutdown_idle(self) -> bool:
        """Let every keeper that keeps nothing exit (after a drain); whether all did.
        Each removes its own cgroup roots as it leaves."""
        all_left = True
        for keeper in list(self.keepers.values()):
            try:
                await keeper.call("shutdown")
            except KeeperGone:
                continue
            except KeeperError:
                all_left = False
            else:
                keeper.closing = True  # it leaves: its connection's end is its own
        return all_left

    async def all_closed(self) -> None:
        """Until every keeper's connection has closed: each one let go has exited."""
        for keeper in list(self.keepers.values()):
            await keeper.closed()


def _answers(home: Path) -> bool | None:
    """Whether the keeper of `home` answers a ping at once; None where none listens
    (blocking, for a worker thread)."""
    try:
        with Connection(home / "sock", timeout_s=0.5) as conn:
            conn.call("ping")
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    except (OSError, KeeperError, ValueError):
        return False
    return True


def _passing(exc: KeeperError) -> bool:
    """Whether a spawn refused so may start if tried again: what the keeper says, a
    keeper that could not be started or did not answer in time, an internal error."""
    return exc.transient or exc.code in ("start", "timeout", "internal")


def _spawn_fields(spec: Spec) -> dict[str, Any]:
    """The spawn request's fields: Spec's own, shallow (dataclasses.asdict deep-copies
    the environment, once per job), in their order, from its __dict__ (Spec has no
    slots), not fields()'s walk."""
    return dict(vars(spec))


def wired(name: str, home: Path) -> Keeper:
    """A keeper's handle and its wire, whose lines, loss and skips go to the handle."""
    wire = Wire(name, lambda _message: None)
    keeper = Keeper(name, home, wire)
    wire.on_message, wire.on_lost, wire.on_skipped = keeper._dispatch, keeper._lost, keeper._skipped
    return keeper


async def _connect(name: str, home: Path) -> Keeper:
    keeper = wired(name, home)
    loop = asyncio.get_running_loop()
    await loop.create_unix_connection(lambda: keeper.wire, str(home / "sock"))
    return keeper
