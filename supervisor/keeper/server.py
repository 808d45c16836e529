"""The keeper's loop: one thread, one selector, JSON lines over a Unix socket.

Requests: {"id": N, "op": ..., ...}; each is answered {"id": N, "ok": true, ...} or
{"id": N, "ok": false, "error": {"code", "message"}}, not always at once (a spawn is
answered once exec's outcome is known, a kill once the job is gone; a gated child not
exec'd within EXEC_ANSWER_S is answered as started, and why it never ran, if it does
not, comes with its exit as `error`). The attached connection also gets {"event":
"exit", "job": {...}} for every exit, once its record is written (journal.py: gpusvd
commits it before anything acts on it, and an exit it leaves unacknowledged for
SYNC_GRACE_S is synced). A malformed line is answered with an error and logged; it
never costs a job.

A spawn with `after` naming a running attempt, or one parked itself (a chain), is
parked here, in memory, until that attempt's exit is written, and dropped with the
connection that sent it: a spawn that was never recorded has never run, and recovery
relies on that (docs/keepers.md). A parked spawn dropped, or refused at its turn, drops
those parked behind it: what they followed will never run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from supervisor.wire import jsonline

from . import spawn
from .connections import Conn as Conn
from .connections import Connections, err
from .jobs import Jobs, Refused, Reply
from .journal import Key, Record
from .log import log_line as log_line  # re-exported: __main__ and tools log through it
from .parked import Parked, Parking

# What this keeper does beyond the first protocol. Keepers outlive an upgrade of gpusvd, so
# a newer gpusvd may find an older keeper, and asks only for what that one announced.
# after_waiting: `after` may name a parked spawn; transient: a spawn error may say that
# trying again may work (`"transient": true`); too_large_kept: a line over the limit is
# answered and the connection kept.
FEATURES = ["after", "after_waiting", "transient", "too_large_kept"]
REAP_RETRY_S = 1.0
PENDING_RETRY_S = 1.0  # journal lines kept in memory (a full disk) are written again
# An exit told to the attached gpusvd and not acknowledged (committed on its side) in this
# long is synced here: a gpusvd that is slow, stuck or gone does not leave it to a power cut.
SYNC_GRACE_S = 0.1
# A gated child that has not exec'd by then is waiting on its working directory or its
# program (a file system that does not answer): answered with its pid, so that gpusvd
# can list it, stop it and cancel it meanwhile, instead of waiting on the file system.
EXEC_ANSWER_S = 1.0


class Server:
    def __init__(self, jobs: Jobs, listener: socket.socket, log: Callable[[str], None]) -> None:
        self.jobs = jobs
        self.listener = listener
        self.log = log
        self.sel = selectors.DefaultSelector()
        self.attached: Conn | None = None
        self.net = Connections(self.sel, listener, log, self._request, self._closed)
        self.parked = Parking()
        self.stopping = False
        self.reap_due = False  # a leader's pidfd or SIGCHLD: one reaping pass this turn
        self.terms = 0  # SIGTERMs seen and not yet logged
        self.sync_retry_at = 0.0  # monotonic: after a sync that failed, none before this
        self.exec_due: dict[Key, float] = {}  # gated children not exec'd: answer them by then
        jobs.on_exit = self._exited
        jobs.unwatch = self._unwatch
        jobs.output.sel = self.sel  # jobs' output pipes are read on this loop
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # A stray signal costs no job: a hangup of the terminal that started us, a ^C,
        # or a SIGTERM from a service manager. Only the daemon's `shutdown` ends a keeper.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.sel.register(wake_r, selectors.EVENT_READ, lambda: self._sigchld(wake_r))

    # -- the loop ---------------------------------------------------------------------

    def serve(self) -> None:
        timeout = self.jobs.tick()
        # A turn's lines go out together (Connections.held): what needs no sync (the
        # answers of spawns, started without waiting for the disk) before the turn's
        # sync, what waited for it (exits) right after it, before the turn's cgroup
        # removals, and what the timers answered (kills) last.
        self.net.held = True
        while not (self.stopping and not self.net.pending_output()):
            for key, _ in self.sel.select(timeout):
                self._guarded(key.data)
            if self.reap_due:
                self._guarded(self._reap)
            self._guarded(self._release)
            self._guarded(self.net.flush_held)
            self._guarded(self._sync)
            self._guarded(self.net.flush_held)
            self._guarded(self._housekeeping)
            timeout = self._guarded_tick()
            self._guarded(self.net.flush_held)
            timeout = self._timeout(timeout)
            if self.stopping:
                timeout = 0.01

    def _timeout(self, ticked: float | None) -> float | None:
        """How long the next select may wait: the jobs' timers, and what this loop must
        try again or do by a time of its own."""
        now = time.monotonic()
        soon = [t for t in (ticked,) if t is not None]
        if self.reap_due:  # the pass failed: try again soon, not only at the next child
            soon.append(REAP_RETRY_S)
        if self.jobs.journal.pending:
            soon.append(PENDING_RETRY_S)
        due = self.jobs.journal.sync_deadline(SYNC_GRACE_S)
        if due is not None:  # a sync that failed is tried again no sooner than retry_at
            soon.append(max(0.0, max(due, self.sync_retry_at) - now))
        if self.net.paused_until:
            soon.append(max(0.0, self.net.paused_until - now))
        if self.exec_due:
            soon.append(max(0.0, min(self.exec_due.values()) - now))
        return min(soon) if soon else None

    def _guarded_tick(self) -> float | None:
        try:
            return self.jobs.tick()
        except Exception as exc:
            self.log(f"internal error: {type(exc).__name__}: {exc}")
            return REAP_RETRY_S

    def _on_term(self, signum: int, frame: object) -> None:
        self.terms += 1  # logged from the loop: a signal handler writes nothing

    def _housekeeping(self) -> None:
        if self.terms:
            self.terms = 0
            self.log("SIGTERM ignored: jobs are kept and the keeper serves on")
        self.net.resume_accepting()
        self._answer_unexeced()

    def _answer_unexeced(self) -> None:
        now = time.monotonic()
        for key, due in list(self.exec_due.items()):
            live = self.jobs.live.get(key)
            if live is None or live.status_fd is None:  # exec's outcome came, or its end
                del self.exec_due[key]
            elif now >= due:
                del self.exec_due[key]
                if self.jobs.answer_started(key):
                    why = "its working directory or program does not answer?"
                    self.log(f"job {key[0]} attempt {key[1]}: answered as started ({why})")

    def _reap_soon(self) -> None:
        self.reap_due = True

    def _reap(self) -> None:
        self.jobs.reap_all()
        self.reap_due = False

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # a bug must not take every job's keeper with it
            self.log(f"internal error: {type(exc).__name__}: {exc}")

    def _release(self) -> None:
        """Start what was parked behind the attempts that ended this turn, before their
        exits are synced: the slot an exit freed waits neither for a turn nor for the disk
        (a successor that cannot start ends too, and releases what is parked behind it)."""
        while self.jobs.ended:
            record = self.jobs.ended.pop(0)
            for parked in self.parked.released_by(record.key):
                if parked.conn.closed:  # one answered at once may have closed it
                    self._never_started((parked.spec.job, parked.spec.attempt))
                    continue
                self._guarded(functools.partial(self._start_parked, parked))

    def _sync(self) -> None:
        """Write the turn's records, sync them when they are due (journal.py: an exit is
        told to an attached gpusvd once written; with none attached, or one that has not
        acknowledged it in SYNC_GRACE_S, once on disk), then do what waited on them. A disk
        that refuses (full) does not hold them back: an exit kept in memory is reported
        all the same (the journal writes it again at each turn until the disk takes it)."""
        journal = self.jobs.journal
        told = self.attached is not None and not self.attached.closed
        now = time.monotonic()
        if now >= self.sync_retry_at and journal.sync_due(now, SYNC_GRACE_S if told else None):
            if not journal.sync():  # a disk that refuses: tried again, not at every turn
                self.sync_retry_at = now + PENDING_RETRY_S
        else:
            journal.write_out()
        waiting, self.jobs.after_sync = self.jobs.after_sync, []
        for action in waiting:
            self._guarded(action)

    def _sigchld(self, fd: int) -> None:
        try:
            while len(os.read(fd, 512)) == 512:  # less: the pipe is empty now
                pass
        except BlockingIOError:
            pass
        self.reap_due = True

    def _closed(self, conn: Conn) -> None:
        if self.attached is conn:
            self.attached = None
        # Nobody is left to be told of these, and a daemon that attaches later takes an
        # attempt without a record for one that never started: it must never start.
        for key in self.parked.drop_conn(conn):
            self._never_started(key)

    @property
    def conns(self) -> set[Conn]:
        return self.net.conns

    # -- requests ---------------------------------------------------------------------

    def _request(self, conn: Conn, line: bytes) -> None:
        rid: object = None
        try:
            msg = jsonline.decode(line)  # the wire's C decoder, as gpusvd's end reads
            if not isinstance(msg, dict):
                raise spawn.BadRequest("a request is a JSON object")
            rid = msg.get("id")
            if not (rid is None or type(rid) is int):
                raise spawn.BadRequest("id: an integer")
            op = msg.get("op")
            handler = self.ops.get(op) if isinstance(op, str) else None
            if handler is None:
                raise spawn.BadRequest(f"unknown op {op!r}")
            handler(self, conn, msg, self._replier(conn, rid))
        except (ValueError, TypeError) as exc:  # JSONDecodeError and BadRequest included
            self.log(f"bad request: {str(exc)[:200]}")
            self.net.send(conn, {"id": rid, "ok": False, "error": err("bad_request", str(exc))})
        except Refused as exc:
            self.net.send(conn, {"id": rid, "ok": False, "error": exc.error()})
        except Exception as exc:  # whatever failed inside, the request gets an answer
            self.log(f"internal error answering a request: {type(exc).__name__}: {exc}")
            error = err("internal", f"{type(exc).__name__}: {exc}")
            self.net.send(conn, {"id": rid, "ok": False, "error": error})

    def _replier(self, conn: Conn, rid: object) -> Callable[[dict[str, Any]], None]:
        def reply(fields: dict[str, Any]) -> None:
            ok = "error" not in fields
            if ok and rid is None:  # a request sent without an id wants only its failure
                return
            self.net.send(conn, {"id": rid, "ok": ok, **fields})

        return reply

    def _exited(self, record: Record) -> None:
        if self.attached is not None:
            self.net.send(self.attached, {"event": "exit", "job": record.to_json()})

    def _never_started(self, key: Key) -> None:
        self.log(f"job {key[0]} attempt {key[1]}: its connection closed before it started")

    def _start_parked(self, parked: Parked) -> None:
        try:
            self._start(parked.spec, parked.reply)
        except Refused as exc:  # answered as _request answers a spawn refused at once
            parked.reply({"error": exc.error()})
            self.parked.drop_behind((parked.spec.job, parked.spec.attempt))
        except Exception as exc:
            self.log(f"internal error starting a parked spawn: {type(exc).__name__}: {exc}")
            parked.reply({"error": err("internal", f"{type(exc).__name__}: {exc}")})
            self.parked.drop_behind((parked.spec.job, parked.spec.attempt))

    def _op_attach(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        """A new gpusvd takes over. Connections opened before it are closed, so a spawn
        that an earlier daemon left in its socket buffer either ran before this (and the
        new daemon's list shows it) or is never read at all."""
        for other in list(self.conns):
            if other is not conn:
                self.net.close(other)
        self.attached = conn
        # After this turn's write: an exit recorded in this same turn is listed once it is
        # in the journal, as it would be reported; the new gpusvd commits it before it acts
        # on it (journal.py). Exits recorded while none was attached were synced then.
        self.jobs.after_sync.append(
            lambda: reply(
                {
                    "pid": os.getpid(),
                    "jobs": self._jobs_json(),
                    "features": FEATURES,
                    "damaged": self.jobs.journal.damaged,
                }
            )
        )

    def _op_ping(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        reply({"pid": os.getpid(), "features": FEATURES})

    def _op_list(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        self.jobs.after_sync.append(lambda: reply({"jobs": self._jobs_json()}))

    def _jobs_json(self) -> list[dict[str, Any]]:
        return [record.to_json() for record in self.jobs.journal.records.values()]

    def _op_spawn(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        spec = spawn.parse_spec(msg)
        after = spawn.parse_after(msg)
        key = (spec.job, spec.attempt)
        if key in self.parked:
            raise Refused("exists", f"job {key[0]} attempt {key[1]} waits to start already")
        self.jobs.refuse_started(key)  # refused now, not once it is its turn
        before = None if after is None else self.jobs.journal.records.get(after)
        waits = before is not None and not before.ended
        if after is not None and (waits or after in self.parked):  # behind one that waits too
            self.parked.park(Parked(spec, after, conn, reply))
            return
        self._start(spec, reply)

    def _start(self, spec: spawn.Spec, reply: Reply) -> None:
        live = self.jobs.spawn(spec, reply)
        if live is None:  # it could not start: answered once that is on disk
            return
        key = (spec.job, spec.attempt)
        if live.pidfd is not None:  # else SIGCHLD alone tells of its exit
            self.sel.register(live.pidfd, selectors.EVENT_READ, self._reap_soon)
        if live.status_fd is not None:  # a gated fork: exec's outcome comes on this pipe
            self.sel.register(live.status_fd, selectors.EVENT_READ, lambda: self._status(key))
            self.exec_due[key] = time.monotonic() + EXEC_ANSWER_S

    def _status(self, key: Key) -> None:
        live = self.jobs.live.get(key)
        if live is not None and live.status_fd is not None:
            self.jobs.exec_outcome(key)

    def _unwatch(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(fd)

    def _op_kill(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        grace = msg.get("grace_s", 10.0)
        if not isinstance(grace, (int, float)) or not 0 <= grace <= 86400:
            raise spawn.BadRequest("grace_s: seconds from 0 to 86400")
        key = _key(msg)
        if self.parked.drop(key):  # nothing of it runs: gone at once
            reply({})
            return
        self.jobs.kill(key, float(grace), reply)

    def _op_ack(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        self.jobs.ack(_key(msg), reply)

    def _op_oom_score_adj(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        value = msg.get("value")
        if type(value) is not int or not -1000 <= value <= 1000:
            raise spawn.BadRequest("value: from -1000 to 1000")
        reply({"failures": self.jobs.set_oom_score_adj(_key(msg), value)})

    def _op_procs(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        reply({"pids": self.jobs.procs(_key(msg))})

    def _op_memory(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        peak, oom = self.jobs.memory(_key(msg))
        reply({"peak_bytes": peak, "oom_kills": oom})

    def _op_shutdown(self, conn: Conn, msg: dict[str, Any], reply: Reply) -> None:
        """Leave only when nothing is left to keep: no job, no unacknowledged exit, no
        spawn waiting for its turn."""
        held, waiting = len(self.jobs.journal.records), len(self.parked)
        if held or waiting:
            also = f", {waiting} waiting to start" if waiting else ""
            raise Refused("busy", f"{held} attempts still kept{also}")
        self.jobs.journal.compact()  # empty: the next daemon need not start us to look
        self.stopping = True
        reply({})

    ops: dict[str, Callable[[Server, Conn, dict[str, Any], Reply], None]] = {
        "attach": _op_attach,
        "ping": _op_ping,
        "list": _op_list,
        "spawn": _op_spawn,
        "kill": _op_kill,
        "ack": _op_ack,
        "oom_score_adj": _op_oom_score_adj,
        "procs": _op_procs,
        "memory": _op_memory,
        "shutdown": _op_shutdown,
    }


def _key(msg: dict[str, Any]) -> Key:
    job, attempt = msg.get("job"), msg.get("attempt")
    if type(job) is not int or type(attempt) is not int:
        raise spawn.BadRequest("job and attempt: integers")
    return (job, attempt)
