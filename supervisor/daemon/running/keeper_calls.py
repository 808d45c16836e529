"""One keeper's connection as gpusvd holds it: calls and their answers, exit events,
and coming back to a keeper that lives after its connection closed (keeper_link).
A running attempt's handle is a `KeptProcess` (handles.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from supervisor.daemon.running import keeper_link as link
from supervisor.daemon.running.keeper_wire import Wire
from supervisor.keeper.client import KeeperError
from supervisor.keeper.journal import Key, Record, record_from
from supervisor.wire.framing import MAX_KEEPER_LINE, encode

log = structlog.get_logger("gpusvd.keepers")

RELIST_S = 0.5  # after a skipped line: long enough for the spawn's watcher to be waiting
RELIST_MAX_S = 60.0  # while list answers cannot be read either


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
    # asyncio's events, not anyio's: a job's start and end wait on one each (anyio's
    # costs 3 us more to make, on the daemon's busiest path)
    _replies: dict[int, tuple[asyncio.Event, list[dict[str, Any]]]] = field(default_factory=dict)
    _ended: dict[Key, Record] = field(default_factory=dict)
    _waiting: dict[Key, asyncio.Event] = field(default_factory=dict)
    gone: bool = False
    features: frozenset[str] = frozenset()  # as its attach announced them
    _relist_due: bool = False
    _relist_s: float = RELIST_S  # doubles while even the list answers are skipped
    _listing: set[int] = field(default_factory=set)  # ids of our own `list` requests
    _on_gone: anyio.Event | None = None
    pidfd: int | None = None  # the keeper process: a closed connection is not a death
    closing: bool = False  # we close it (or let it go): a closed connection is the end
    _back: anyio.Event | None = None  # set once connected again; None while connected
    _spawning: dict[int, Key] = field(default_factory=dict)  # spawns not answered yet
    _task: asyncio.Task[None] | None = None
    # The watch (keeper_watch.py): when the oldest ping not yet answered was sent (None:
    # every message so far answered), and since when it counts as not answering.
    asked: float | None = None
    silent_since: float | None = None
    # Attempts whose end gpusvd recorded itself (it killed them while the keeper did not
    # answer): their exits, when the keeper sends them, are only acknowledged.
    settled: set[Key] = field(default_factory=set)

    async def call(
        self,
        op: str,
        *,
        drop: Drop | None = None,
        drop_grace_s: float = 0.0,
        deadline_s: float | None = None,
        written: Callable[[], None] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """The request's answer. With `drop`: asked before the answer came, a `kill` of
        the same job and attempt follows on this connection: how a spawn held back by its
        keeper is dropped. Any other call has a deadline (keeper_link.deadline_for)."""
        if self._back is not None:  # connecting again to a keeper that lives
            with anyio.move_on_after(link.RECONNECT_S + link.CALL_DEADLINE_S):
                await self._back.wait()
        return await self._call(op, drop, drop_grace_s, fields, deadline_s, written)

    async def _call(
        self,
        op: str,
        drop: Drop | None,
        drop_grace_s: float,
        fields: dict[str, Any],
        deadline_s: float | None = None,
        written: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        if self.gone:
            raise KeeperGone(f"keeper {self.name} is gone")
        self._next += 1
        rid, done = self._next, asyncio.Event()
        box: list[dict[str, Any]] = []
        self._replies[rid] = (done, box)
        try:
            await self._send(rid, op, fields)
        except (KeeperGone, KeeperError):
            self._replies.pop(rid, None)
            raise
        if written is not None:
            written()
        if drop is None:
            if op == "spawn":  # answered from the records if the connection is lost
                self._spawning[rid] = (fields["job"], fields["attempt"])
            try:
                await self._answer(rid, done, box, op, fields, deadline_s)
            finally:
                self._spawning.pop(rid, None)
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
            raise KeeperError.of(answer)
        return answer

    async def _answer(
        self,
        rid: int,
        done: asyncio.Event,
        box: list[dict[str, Any]],
        op: str,
        fields: dict[str, Any],
        deadline_s: float | None = None,
    ) -> None:
        """Until the answer came, or the call's deadline passed (`deadline_s`, else
        keeper_link.deadline_for): then the keeper is stuck (keeper_link.keeper_stuck).
        A spawn waits on (its job may have started); any other call fails, `timeout`.
        The deadline is a timer that wakes the wait, not a cancel scope: one a call, on
        the path of every job's start (a scope costs 10-15 us more)."""
        limit = link.deadline_for(op, fields) if deadline_s is None else deadline_s
        began = time.monotonic()
        timer = asyncio.get_running_loop().call_later(limit, done.set)
        try:
            await done.wait()
        finally:
            timer.cancel()
        if box or rid not in self._replies:  # answered, or failed with its connection
            return
        waited = time.monotonic() - began
        if op == "spawn":
            link.keeper_stuck(self.name, op, waited, still_waiting=True)
            done.clear()
            await done.wait()
            return
        self._replies.pop(rid, None)
        link.keeper_stuck(self.name, op, waited, still_waiting=False)
        raise KeeperError("timeout", f"keeper {self.name}: no answer to {op} in {limit:g}s")

    async def tell(self, op: str, **fields: Any) -> None:
        """A request whose answer nobody waits for, sent without an id: a keeper answers
        such a request only if it fails (an older one answers `"id": null`, dropped)."""
        if self.gone:
            raise KeeperGone(f"keeper {self.name} is gone")
        await self._send(None, op, fields)

    def _tell_now(self, op: str, fields: dict[str, Any], *, answered: bool = False) -> None:
        """`tell`, from a callback: the write needs no await, and a closed connection
        has dropped whatever it held back anyway. `answered`: with an id, so that the
        keeper answers it (a ping, whose answer is the point)."""
        rid = None
        if answered:
            self._next += 1
            rid = self._next
        with contextlib.suppress(KeeperGone):
            self._write(rid, op, fields)

    async def _send(self, rid: int | None, op: str, fields: dict[str, Any]) -> None:
        self._write(rid, op, fields)

    def _write(self, rid: int | None, op: str, fields: dict[str, Any]) -> None:
        """One line in the wire's one encoding (framing.encode: what a client sent comes
        out no longer), refused here, before it is sent, when over the keeper's limit.
        Without an id: a request answered only if it fails."""
        head = {"op": op} if rid is None else {"id": rid, "op": op}
        line = encode({**head, **fields})
        if len(line) > MAX_KEEPER_LINE:
            message = f"a {op} of {len(line)} bytes, over the keeper's {MAX_KEEPER_LINE}"
            raise KeeperError("too_large", message)
        if not self.wire.write(line):
            raise KeeperGone(f"keeper {self.name}: its connection is closed")

    async def ended(self, key: Key) -> Record:
        while key not in self._ended:
            if self.gone:
                raise KeeperGone(f"keeper {self.name} is gone")
            event = self._waiting.get(key)
            if event is None:
                event = self._waiting[key] = asyncio.Event()
            await event.wait()
        return self._ended.pop(key)

    def _exited(self, record: Record) -> None:
        if record.key in self.settled:  # its end is recorded already: only let it go
            self.settled.discard(record.key)
            self._tell_now("ack", {"job": record.job, "attempt": record.attempt})
            return
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

    def ping(self, now: float) -> None:
        """Ask the keeper for a sign of life, unless a question is still unanswered: any
        message heard answers it (`_dispatch`)."""
        if self.asked is None and not self.gone and self._back is None:
            self.asked = now
            self._tell_now("ping", {}, answered=True)

    def settle(self, record: Record) -> None:
        """An end gpusvd recorded itself (the keeper did not answer; gpusvd killed the
        job's cgroup): the watcher takes it as the keeper's own."""
        self.settled.add(record.key)
        self._ended[record.key] = record
        event = self._waiting.pop(record.key, None)
        if event is not None:
            event.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        self.asked = None  # it answers
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
        """The connection closed. The keeper is lost only if its process is gone; while
        it lives, we connect again (keeper_link), its jobs watched on."""
        if self.closing or self.gone or not link.process_alive(self.pidfd):
            self._gone_for_good()
            return
        if self._back is not None:
            # A connection made while connecting again: its attach fails now, not at its
            # deadline (a keeper that was dying when its connection closed, its pidfd not
            # yet readable, is found gone at the next try).
            self._fail_calls()
            return
        log.warning("keeper connection lost; the keeper lives: connecting again", keeper=self.name)
        self._back = anyio.Event()
        self._fail_calls()
        self._task = asyncio.get_running_loop().create_task(self._reconnect())

    def _fail_calls(self) -> None:
        """Every call waiting on the lost connection fails, but a spawn: that one is
        answered by the records once attached again."""
        for rid, (done, _) in list(self._replies.items()):
            if rid not in self._spawning:
                done.set()
                del self._replies[rid]

    async def _reconnect(self) -> None:
        backoff = link.Backoff()
        while link.process_alive(self.pidfd) and not self.closing:
            try:
                await self._reattach()
                return
            except (OSError, KeeperGone, KeeperError) as exc:
                log.info("keeper not reached again yet", keeper=self.name, error=repr(exc))
                self.wire.close()  # a connection made, its attach unanswered: not kept
            pause = backoff.next()
            if pause is None:
                link.keeper_stuck(self.name, "connect", link.RECONNECT_S, still_waiting=False)
                break
            await anyio.sleep(pause)
        self._gone_for_good()

    async def _reattach(self) -> None:
        self.wire = Wire(self.name, self._dispatch)
        self.wire.on_lost, self.wire.on_skipped = self._lost, self._skipped
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: self.wire, str(self.home / "sock"))
        answer = await self._call("attach", None, 0.0, {})
        records = {r.key: r for r in map(record_from, answer["jobs"])}
        for record in records.values():
            if record.ended:
                self._exited(record)
        for rid, key in list(self._spawning.items()):
            self._answered_by(rid, records.get(key))
        back, self._back = self._back, None
        if back is not None:
            back.set()
        log.info("keeper attached again", keeper=self.name, records=len(records))

    def _answered_by(self, rid: int, record: Record | None) -> None:
        """A spawn sent on a connection that was lost: it ran (its record is listed) or
        it was never read, and never will be (the attach closed that connection)."""
        slot = self._replies.pop(rid, None)
        if slot is None:
            return
        if record is not None:
            slot[1].append({"id": rid, "ok": True, "job": record.to_json()})
        else:
            error = {"code": "spawn", "message": "its keeper reconnected before reading it"}
            slot[1].append({"id": rid, "ok": False, "error": {**error, "transient": True}})
        slot[0].set()

    def _gone_for_good(self) -> None:
        self.gone = True
        back, self._back = self._back, None
        if back is not None:  # calls that waited for a new connection fail now
            back.set()
        if self._on_gone is not None:
            self._on_gone.set()
        for done, _ in self._replies.values():
            done.set()
        self._replies.clear()
        for event in self._waiting.values():
            event.set()
