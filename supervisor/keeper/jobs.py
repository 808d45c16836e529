"""The keeper's jobs: start, reap, kill, forget: everything but the socket.

Durability rule: a job's command runs only after its start record is written to the
journal (the gate), not synced: the page cache outlives a crash of the keeper or gpusvd,
and a power loss that loses the line ends the process too (journal.py). An exit is
reported at the end of the turn that wrote it, synced first when it is due (journal.py:
none attached, or no ack in time); an ack is written, not synced. `after_sync` holds what
waits for the end of the turn's write (and sync). A spawn parked behind an attempt needs
only that attempt's exit written (`ended`): the freed slot does not wait for the disk.
A full disk does not hold answers back: an exit the journal keeps in memory is reported
all the same and written once the disk has room (journal.py). Jobs' output goes through
the relay (output.py): what the disk refuses is dropped and counted with the exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import cgroup, direct, pidfds, spawn
from .answers import Refused as Refused
from .answers import Reply as Reply
from .answers import spawn_error
from .journal import Journal, Key, Record
from .oom_adj import write_oom_score_adj
from .output import Relay, Sink, output_of
from .spawn import Spec, transient

KILL_POLL_S = 0.02


@dataclass
class Live:
    """What the keeper holds for a started job while its leader runs (its own child,
    not reaped yet: the pid is the job's until the keeper reaps it)."""

    pidfd: int | None  # None: it could not be opened (EMFILE); SIGCHLD still reaps it
    status_fd: int | None  # until exec's outcome is known
    spawn_reply: Reply | None
    error: str = ""
    transient: bool = False  # the error is a passing one (the status pipe said so)


@dataclass
class Killing:
    deadline: float
    waiters: list[Reply] = field(default_factory=list)


class Jobs:
    def __init__(self, journal: Journal, roots: cgroup.Roots, log: Callable[[str], None]) -> None:
        self.journal = journal
        self.roots = roots
        self.log = log
        self.live: dict[Key, Live] = {}
        self.killing: dict[Key, Killing] = {}
        self.removing: dict[Key, cgroup.Groups] = {}  # acknowledged; cgroups not yet gone
        self.after_sync: list[Callable[[], None]] = []
        self.on_exit: Callable[[Record], None] = lambda record: None  # at the turn's end
        self.ended: list[Record] = []  # exits written this turn, their slots not released
        self.unwatch: Callable[[int], None] = lambda fd: None  # before a watched fd closes
        self._warned: set[str] = set()
        self.direct: direct.Home | None = None  # where jobs may start with posix_spawn
        self.fork = spawn.fork  # the gated fork: a seam for a fork that fails
        self.output = Relay(log)  # jobs' stdout and stderr, through pipes into their files

    def warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            self.log(message)

    @staticmethod
    def groups(record: Record) -> cgroup.Groups:
        return cgroup.Groups(record.cgroup or None, record.memcg or None)

    # -- start ------------------------------------------------------------------------

    def refuse_started(self, key: Key) -> None:
        if key in self.journal.records:
            raise Refused("exists", f"job {key[0]} attempt {key[1]} was started already")

    def spawn(self, spec: spawn.Spec, reply: Reply) -> Live | None:
        """The job started, or None when it could not be (answered once that is on disk);
        Refused when it was refused with nothing recorded (`transient` where trying
        again may work)."""
        key = (spec.job, spec.attempt)
        self.refuse_started(key)
        try:
            groups = cgroup.make(self.roots, spec.job, spec.attempt, self.warn_once)
        except cgroup.Busy as exc:
            raise Refused("spawn", str(exc), transient=True) from None
        if not groups.any:
            self.warn_once("no cgroup for jobs: their processes are found through the tree")
        if self.direct is not None and spec.uid is None and groups.any:
            with contextlib.suppress(direct.NotNow):
                return self._spawn_direct(self.direct, spec, groups, reply)
        sink = self._sink(spec, groups)
        try:
            cgroup.configure(groups, spec.mem_max)
            forked = self.fork(spec, groups, sink.out_w, sink.err_w)
        except OSError as exc:  # nothing ran; the cgroups are unused
            _remove_quietly(groups)
            Relay.abandon(sink)
            raise Refused("spawn", spawn.open_failure(exc), transient=transient(exc)) from None
        # The start tick (a /proc read, 35-50 us) only without a cgroup: takeover.py
        ticks = 0 if groups.any else spawn.start_ticks(forked.pid) or 0
        record = Record(spec.job, spec.attempt, forked.pid, ticks, time.time(), *groups)
        try:
            self.journal.append("start", record)
        except OSError as exc:  # the gate never opens: the child exits, reaped as an orphan
            os.close(forked.gate)
            os.close(forked.status)
            Relay.abandon(sink)
            self.log(f"job {spec.job} attempt {spec.attempt}: start not recorded: {exc}")
            message = f"cannot record the start: {exc.strerror}"
            raise Refused("spawn", message, transient=True) from None
        # Written is enough (module docstring). Opened at once: until the child execs,
        # each page the keeper writes is copied for it. (Waiting here for the exec saved
        # no CPU that could be measured and held the loop: fewer jobs/s.)
        spawn.open_gate(forked.gate)
        self.output.start(output_of(spec), sink)
        return self._hold(record, forked.status, reply)

    def _sink(self, spec: Spec, groups: cgroup.Groups) -> Sink:
        try:  # out of descriptors: nothing ran
            return Relay.sink(spec.stdout == spec.stderr)
        except OSError as exc:
            _remove_quietly(groups)
            raise Refused("spawn", spawn.open_failure(exc), transient=transient(exc)) from None

    def _hold(self, record: Record, status_fd: int | None, reply: Reply | None) -> Live:
        """A started job into the live table, whatever fails: without a pidfd (EMFILE)
        it is still reaped through SIGCHLD, and signalled through its cgroup."""
        try:
            pidfd: int | None = os.pidfd_open(record.pid)
        except OSError as exc:
            pidfd = None
            self.log(f"job {record.job} attempt {record.attempt}: no pidfd: {exc.strerror}")
        live = self.live[record.key] = Live(pidfd, status_fd, reply)
        return live

    def _spawn_direct(
        self, home: direct.Home, spec: Spec, groups: cgroup.Groups, reply: Reply
    ) -> Live | None:
        """posix_spawn (direct.py). The record, naming the job's cgroups, is written before
        the process exists, and its pid once it does (takeover.py: what a keeper left)."""
        home.near(spec, self.warn_once)  # NotNow: the fork's child touches them
        sink = self._sink(spec, groups)
        try:
            with home.oom_score_adj(spec.oom_score_adj):  # NotNow: the fork takes it over
                record = Record(spec.job, spec.attempt, 0, 0, time.time(), *groups)
                try:
                    self.journal.append("start", record)
                except OSError as exc:
                    _remove_quietly(groups)
                    self.log(f"job {spec.job} attempt {spec.attempt}: start not recorded: {exc}")
                    message = f"cannot record the start: {exc.strerror}"
                    raise Refused("spawn", message, transient=True) from None
                pid = home.start(spec, groups, sink.out_w, sink.err_w, spawn.devnull())
        except direct.Failed as exc:
            if exc.stderr:  # into the pipe: relayed to the job's stderr file
                with contextlib.suppress(OSError):
                    os.write(sink.err_w, exc.stderr.encode(errors="replace"))
            self.output.start(output_of(spec), sink)
            self._never_ran(record, str(exc), reply, exc.transient)
            return None
        except BaseException:  # nothing ran (NotNow: the fork makes pipes of its own)
            Relay.abandon(sink)
            raise
        self.output.start(output_of(spec), sink)
        if home.broken:
            self.log(f"jobs start by fork from now on: {home.broken}")
            self.direct = None
        # From here the job runs: nothing may keep it out of the live table.
        self.journal.append("pid", record, pid=pid, start_ticks=0)  # it has a cgroup (above)
        live = self._hold(record, None, None)
        try:  # once the keeper is out of the job's cgroup
            cgroup.configure(groups, spec.mem_max)
        except OSError as exc:
            self.log(f"job {spec.job} attempt {spec.attempt}: memory limit not set: {exc}")
        reply({"job": record.to_json()})
        return live

    def _never_ran(self, record: Record, error: str, reply: Reply, passing: bool) -> None:
        """The record of a start whose command could not run, ended as a gated child's
        exit 127 would have ended it; answered once that end is on disk."""
        self.journal.append(
            "exit",
            record,
            ended_at=time.time(),
            wait_status=127 << 8,
            exit_code=127,
            error=error,
            peak_bytes=None,
            oom_kills=None,
            leftovers=0,
            output_dropped=self.output.ended(record.key),
        )
        self.after_sync.append(lambda: reply({"error": spawn_error(error, passing)}))
        self.after_sync.append(lambda: self.on_exit(record))
        self.ended.append(record)

    def exec_outcome(self, key: Key) -> None:
        """The status pipe is readable: EOF means the command runs; text says why not."""
        live = self.live[key]
        assert live.status_fd is not None
        data = os.read(live.status_fd, 4096)
        self.unwatch(live.status_fd)
        os.close(live.status_fd)
        live.status_fd = None
        if data:  # answered once the child's exit is on disk: _ended()
            live.transient = data.startswith(spawn.TRANSIENT)
            live.error = data.removeprefix(spawn.TRANSIENT).decode(errors="replace")
        else:
            self.answer_started(key)

    def answer_started(self, key: Key) -> bool:
        """The spawn answered with the job's record, unless it was already; whether now."""
        live = self.live[key]
        reply, live.spawn_reply = live.spawn_reply, None
        if reply is not None:
            reply({"job": self.journal.records[key].to_json()})
        return reply is not None

    # -- exit -------------------------------------------------------------------------

    def reap_all(self) -> None:
        """A leader's pidfd or SIGCHLD: collect every exited child in one pass, leaders
        recorded; the rest are orphans of jobs re-parented to us (we are a subreaper)."""
        leaders: dict[int, Key] | None = None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if leaders is None:
                leaders = {self.journal.records[key].pid: key for key in self.live}
            key = leaders.get(pid)
            if key is not None:
                self._ended(key, status)

    def _ended(self, key: Key, status: int) -> None:
        record, live = self.journal.records[key], self.live[key]
        if live.status_fd is not None:
            self.exec_outcome(key)  # the pipe is closed or holds the reason by now
        del self.live[key]
        if live.pidfd is not None:
            self.unwatch(live.pidfd)
            os.close(live.pidfd)
        groups = self.groups(record)
        peak, oom = cgroup.memory(groups)
        self.journal.append(
            "exit",
            record,
            ended_at=time.time(),
            wait_status=status,
            exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            error=live.error or None,
            peak_bytes=peak,
            oom_kills=oom,
            leftovers=len(cgroup.pids(groups) if groups.any else self._escapees(record)),
            output_dropped=self.output.ended(key),
        )
        reply, error, passing = live.spawn_reply, live.error, live.transient
        if reply is not None and error:
            self.after_sync.append(lambda: reply({"error": spawn_error(error, passing)}))
        self.after_sync.append(lambda: self.on_exit(record))
        self.ended.append(record)

    # -- kill -------------------------------------------------------------------------

    def kill(self, key: Key, grace_s: float, reply: Reply) -> None:
        """SIGTERM with SIGCONT (a stopped process would sit on SIGTERM through the whole
        grace), SIGKILL to whatever is left at the deadline; answered once all are gone."""
        record = self._known(key)
        if self._gone(record):
            reply({})
            return
        killing = self.killing.get(key)
        if killing is None:
            killing = self.killing[key] = Killing(time.monotonic() + grace_s)
            self.send(record, signal.SIGTERM)
            self.send(record, signal.SIGCONT)
        killing.deadline = min(killing.deadline, time.monotonic() + grace_s)
        killing.waiters.append(reply)
        self.tick()

    def send(self, record: Record, sig: int) -> None:
        """`sig` to every process of the job, each through a pidfd (pidfds.py): the
        leader's group only while the keeper holds the leader unreaped, the rest from
        its cgroup, or, without one, from the unreaped leader's tree and the job's
        processes re-parented to the keeper."""
        groups, live = self.groups(record), self.live.get(record.key)
        # Listed before the first signal: a child whose parent it kills is re-parented
        # to us, out of the tree, before a later look could find it there.
        pids = [] if groups.any else [p for p in self._tree(record) if p != record.pid]
        if live is not None and live.pidfd is not None and record.pid > 0:
            pidfds.send(live.pidfd, sig)
            pidfds.signal_group_of(live.pidfd, record.pid, sig, unreaped=True)
        if groups.any:
            cgroup.signal_groups(groups, sig)
        elif pids:
            pidfds.signal_started(pids, sig)

    def _gone(self, record: Record) -> bool:
        groups = self.groups(record)
        if groups.any:
            return record.ended and not cgroup.pids(groups)
        return record.ended and not self._escapees(record)

    def _tree(self, record: Record) -> list[int]:
        """Without a cgroup: the leader's descendants while it lives, and the escapees."""
        unreaped = record.key in self.live and record.pid > 0 and not record.ended
        tree = cgroup.tree_pids(record.pid) if unreaped else []  # a reaped pid may be another's
        return tree + [p for p in self._escapees(record) if p not in tree]

    @staticmethod
    def _escapees(record: Record) -> list[int]:
        """The job's processes re-parented to us (we are a subreaper), by their tag."""
        found = cgroup.orphan_pids(os.getpid(), record.job, record.attempt)
        return [p for p in found if p != record.pid or not record.ended]

    def tick(self) -> float | None:
        """Deadlines due now; the seconds until the next one, None when none waits."""
        now = time.monotonic()
        for key, killing in list(self.killing.items()):
            record = self.journal.records.get(key)
            if record is None or self._gone(record):
                del self.killing[key]
                for reply in killing.waiters:
                    reply({})
            elif now >= killing.deadline:
                groups = self.groups(record)
                if groups.any:
                    cgroup.kill_all(groups)
                else:
                    self.send(record, signal.SIGKILL)
        for key, groups in list(self.removing.items()):
            if self._remove(groups):
                del self.removing[key]
        if self.removing:
            return KILL_POLL_S
        if self.killing:
            return max(0.0, min(min(k.deadline for k in self.killing.values()) - now, KILL_POLL_S))
        return None

    # -- acknowledge ------------------------------------------------------------------

    def ack(self, key: Key, reply: Reply) -> None:
        record = self._known(key)
        if not record.ended:
            raise Refused("running", f"job {key[0]} attempt {key[1]} has not ended")
        self.journal.append("ack", record)
        self.after_sync.append(lambda: reply({}))
        self.removing[key] = self.groups(record)

    def _remove(self, groups: cgroup.Groups) -> bool:
        try:
            if cgroup.remove(groups):  # an empty cgroup goes at once, without a look inside
                return True
        except OSError as exc:  # not EBUSY: nothing to wait for, said once
            self.warn_once(f"cannot remove cgroup {groups}: {exc.strerror}")
            return True
        cgroup.kill_all(groups)  # the attempt is over: nothing of it may run on
        return False

    # -- a running job's processes -------------------------------------------------

    def procs(self, key: Key) -> list[int]:
        record = self._known(key)
        groups = self.groups(record)
        if groups.any:
            return cgroup.pids(groups)
        alive = key in self.live and record.pid > 0 and not record.ended
        tree = [record.pid] if alive else []
        return tree + [p for p in self._tree(record) if p not in tree]

    def memory(self, key: Key) -> tuple[int | None, int | None]:
        return cgroup.memory(self.groups(self._known(key)))

    def set_oom_score_adj(self, key: Key, value: int) -> list[str]:
        return write_oom_score_adj(self.procs(key), value)

    def _known(self, key: Key) -> Record:
        record = self.journal.records.get(key)
        if record is None:
            raise Refused("unknown", f"job {key[0]} attempt {key[1]} is not known here")
        return record


def _remove_quietly(groups: cgroup.Groups) -> None:
    with contextlib.suppress(OSError):
        cgroup.remove(groups)
