"""gpusvd's side of the keepers: start them, spawn through them, take their jobs back.

One `Keeper` per keeper directory (`<state>/keepers/<name>`), one connection each,
attached: a newer gpusvd's attach closes an older one's connection, and every exit is
pushed to us once it is on the keeper's disk. A running attempt's handle is a
`KeptProcess` (kept.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.daemon.running.handles import KeptProcess
from supervisor.daemon.running.keeper_wire import Wire
from supervisor.daemon.running.launch import SpawnError
from supervisor.keeper.client import KeeperError, launch
from supervisor.keeper.journal import Key, Record, record_from
from supervisor.keeper.spawn import Spec

log = structlog.get_logger("gpusvd.keepers")

RELIST_S = 0.5  # after a skipped line: long enough for the spawn's watcher to be waiting
RELIST_MAX_S = 60.0  # while list answers cannot be read either


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


class KeeperGone(Exception):
    """The keeper's connection closed: it died, or a newer gpusvd attached."""


class SpawnDropped(Exception):
    """A spawn started ahead never ran: killed while its keeper held it back, or its
    keeper (or the connection to it) went away meanwhile, which drops it too (`gone`)."""

    def __init__(self, message: str, *, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


class Drop:
    """A request to drop a spawn that its keeper holds back behind another job: sent at
    once when the spawn is on its connection, else right after the spawn itself (a kill
    of the same job and attempt, on the same connection, so after it), and never once
    the spawn was answered."""

    def __init__(self) -> None:
        self.asked = False
        self._send: Callable[[], None] | None = None

    def ask(self) -> None:
        if not self.asked:
            self.asked = True
            if self._send is not None:
                self._send()

    def arm(self, send: Callable[[], None] | None) -> None:
        self._send = send
        if send is not None and self.asked:
            send()


@dataclass
class Keeper:
    name: str
    home: Path
    wire: Wire
    pid: int = 0
    _next: int = 0
    _replies: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = field(default_factory=dict)
    _ended: dict[Key, Record] = field(default_factory=dict)
    _waiting: dict[Key, anyio.Event] = field(default_factory=dict)
    gone: bool = False
    features: frozenset[str] = frozenset()  # as its attach announced them
    _relist_due: bool = False
    _relist_s: float = RELIST_S  # doubles while even the list answers are skipped
    _listing: set[int] = field(default_factory=set)  # ids of our own `list` requests
    _on_gone: anyio.Event | None = None

    async def call(
        self,
        op: str,
        *,
        drop: Drop | None = None,
        drop_grace_s: float = 0.0,
        **fields: Any,
    ) -> dict[str, Any]:
        """The request's answer. With `drop`: asked before the answer came, a `kill` of
        the same job and attempt follows on this connection: how a spawn held back by its
        keeper is dropped."""
        if self.gone:
            raise KeeperGone(f"keeper {self.name} is gone")
        self._next += 1
        rid, done = self._next, anyio.Event()
        box: list[dict[str, Any]] = []
        self._replies[rid] = (done, box)
        try:
            await self._send(rid, op, fields)
        except KeeperGone:
            self._replies.pop(rid, None)
            raise
        if drop is None:
            await done.wait()
        else:
            job, attempt = fields["job"], fields["attempt"]
            kill = {"job": job, "attempt": attempt, "grace_s": drop_grace_s}
            drop.arm(lambda: self._tell_now("kill", kill))
            try:
                await done.wait()
            finally:
                drop.arm(None)
        if not box:
            raise KeeperGone(f"keeper {self.name} went away before it answered")
        answer: dict[str, Any] = box[0]
        if not answer.get("ok"):
            error = answer.get("error") or {}
            raise KeeperError(str(error.get("code")), str(error.get("message")))
        return answer

    async def tell(self, op: str, **fields: Any) -> None:
        """A request whose answer nobody waits for: its id is not kept, so the answer is
        dropped when it comes."""
        if self.gone:
            raise KeeperGone(f"keeper {self.name} is gone")
        self._next += 1
        await self._send(self._next, op, fields)

    def _tell_now(self, op: str, fields: dict[str, Any]) -> None:
        """`tell`, from a callback: the write needs no await, and a closed connection
        has dropped whatever it held back anyway."""
        self._next += 1
        with contextlib.suppress(KeeperGone):
            self._write(self._next, op, fields)

    async def _send(self, rid: int, op: str, fields: dict[str, Any]) -> None:
        self._write(rid, op, fields)

    def _write(self, rid: int, op: str, fields: dict[str, Any]) -> None:
        line = json.dumps({"id": rid, "op": op, **fields}, separators=(",", ":")) + "\n"
        if not self.wire.write(line.encode()):
            raise KeeperGone(f"keeper {self.name}: its connection is closed")

    async def ended(self, key: Key) -> Record:
        while key not in self._ended:
            if self.gone:
                raise KeeperGone(f"keeper {self.name} is gone")
            event = self._waiting.setdefault(key, anyio.Event())
            await event.wait()
        return self._ended.pop(key)

    def _exited(self, record: Record) -> None:
        self._ended[record.key] = record
        event = self._waiting.pop(record.key, None)
        if event is not None:
            event.set()

    def _skipped(self) -> None:
        """A line was skipped: it may have been an exit. The keeper's journal still
        holds every exit not acknowledged, so its `list` is read again shortly, and each
        exit a watcher still waits for is taken from there."""
        if self._relist_due or self.gone:
            return
        self._relist_due = True
        asyncio.get_running_loop().call_later(self._relist_s, self._relist)
        self._relist_s = min(RELIST_MAX_S, self._relist_s * 2)

    def _relist(self) -> None:
        self._relist_due = False
        self._next += 1
        self._listing.add(self._next)
        try:
            self._write(self._next, "list", {})
        except KeeperGone:
            self._listing.discard(self._next)

    def _listed(self, message: dict[str, Any]) -> None:
        """Our own `list`'s answer: a record that cannot be read here either is logged
        once more, not listed again (that would go on for as long as it is kept)."""
        self._relist_s = RELIST_S
        found = 0
        for raw in message.get("jobs") or ():
            try:
                record = record_from(raw)
            except Exception as exc:
                log.error("keeper record unreadable", keeper=self.name, error=repr(exc))
                continue
            if record.ended and record.key in self._waiting and record.key not in self._ended:
                self._exited(record)
                found += 1
        log.info("keeper list read again after a skipped line", keeper=self.name, exits=found)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if message.get("event") == "exit":
            self._exited(record_from(message["job"]))
            return
        if message.get("id") in self._listing:
            self._listing.discard(message["id"])
            self._listed(message)
            return
        slot = self._replies.pop(message.get("id", -1), None)
        if slot is not None:
            slot[1].append(message)
            slot[0].set()

    async def closed(self) -> None:
        """Until the connection has closed: a keeper let go has then exited."""
        if not self.gone:
            self._on_gone = self._on_gone or anyio.Event()
            await self._on_gone.wait()

    def _lost(self) -> None:
        self.gone = True
        if self._on_gone is not None:
            self._on_gone.set()
        for done, _ in self._replies.values():
            done.set()
        self._replies.clear()
        for event in self._waiting.values():
            event.set()


class Keepers:
    """The keepers of one state dir, used inside `async with`: each connection's reader
    runs in this object's own task group."""

    def __init__(
        self, state_dir: Path, cgroup2: Path | None = None, memcg: Path | None = None
    ) -> None:
        self.root = state_dir / "keepers"
        self.cgroup2, self.memcg = cgroup2, memcg
        self.keepers: dict[str, Keeper] = {}
        self._lock = anyio.Lock(fast_acquire=True)

    async def __aenter__(self) -> Keepers:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for keeper in self.keepers.values():  # the connections; the keepers live on
            keeper.wire.close()

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
        async with self._lock:
            keeper = self.keepers.get(name)
            if keeper is not None and not keeper.gone:
                return keeper, []
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            home = self.home(name)
            v2, v1 = self.roots(name)
            await anyio.to_thread.run_sync(launch, home, v2, v1)
            keeper = await _connect(name, home)
            answer = await keeper.call("attach")
            keeper.pid = int(answer["pid"])
            keeper.features = frozenset(answer.get("features") or ())
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
    ) -> KeptProcess:
        """Start the job through the named keeper; with `after`, once that attempt (of the
        same keeper) has exited, unless `drop` is asked first. Raises SpawnError with a
        readable reason (including when no keeper can be started), SpawnDropped for a
        spawn after another that never ran."""
        fields = _spawn_fields(spec)
        if after is not None:
            fields["after"] = {"job": after[0], "attempt": after[1]}
        try:
            keeper, _ = await self.ensure(name)
            drop = drop if after else None
            answer = await keeper.call("spawn", drop=drop, drop_grace_s=grace_s, **fields)
        except KeeperError as exc:
            if exc.code == "dropped":
                raise SpawnDropped(exc.message) from None
            raise SpawnError(exc.message if exc.code == "spawn" else str(exc)) from None
        except (KeeperGone, OSError) as exc:
            if after is not None:  # a held-back spawn goes with its connection
                raise SpawnDropped(f"keeper {name} went away: {exc}", gone=True) from None
            raise SpawnError(f"keeper {name} unavailable: {exc}") from None
        return KeptProcess(keeper, record_from(answer["job"]))

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
        return keeper is not None and not keeper.gone and feature in keeper.features

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
            keeper, records = await self.ensure(name)
            for record in records:
                found[record.key] = KeptProcess(keeper, record)
        return found

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
        return all_left

    async def all_closed(self) -> None:
        """Until every keeper's connection has closed: each one let go has exited."""
        for keeper in list(self.keepers.values()):
            await keeper.closed()


def _spawn_fields(spec: Spec) -> dict[str, Any]:
    """The spawn request's fields: Spec's own, shallow (dataclasses.asdict deep-copies
    the environment, once per job)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


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
