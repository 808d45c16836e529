"""Fork a job so that it cannot run its command before its start is in the journal.

The child sets itself up (session, oom_score_adj, cgroups, its stdout and stderr on the
keeper's relay pipes (output.py), the user's ids, then the working directory entered as
that user) and then blocks on a gate pipe.
The keeper writes the start record (pid, start time, cgroups) to the journal and then
opens the gate at once: written (in the page cache) is enough, not synced, because the
record must outlive a crash of the keeper or of gpusvd, which the page cache does, and a
power loss that takes the record also ends the process it describes (recovery calls an
attempt without a record `interrupted`, which is then right). The record reaches the
disk with the journal's next sync. A keeper that dies before the record is written
closes the pipe, and the child exits without running anything. A status pipe, closed
by exec, tells the keeper whether exec worked.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import cgroup
from .journal import Key
from .pidfds import start_ticks as start_ticks  # re-exported: the spawn path reads it

GO = b"g"
TRANSIENT = b"\x01"  # on the status pipe, before a reason: a passing one (EAGAIN...)
# Failures that may pass: the host is short of processes, memory, descriptors or disk,
# or a call was interrupted. A start that failed so is tried again by gpusvd, within
# the job's ordinary retry budget; any other failure cannot fix itself.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.ENOMEM,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOSPC,
        errno.EINTR,
        errno.EBUSY,
        errno.EDQUOT,
    }
)
# Signals the keeper ignores or handles, set back to their defaults for a job's command
# (an ignored signal stays ignored across exec).
JOB_DEFAULTS = (
    signal.SIGCHLD,
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGINT,
)


def transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


class BadRequest(ValueError):
    """A request the keeper cannot act on: answered with this message, nothing changes."""


@dataclass(frozen=True)
class Spec:
    job: int
    attempt: int
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    stdout: str
    stderr: str
    uid: int | None = None  # None: the keeper's own user
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    oom_score_adj: int | None = None
    mem_max: int | None = None  # bytes
    index: str | None = None  # where the order of the two streams is recorded (output.py)


def parse_spec(msg: dict[str, Any]) -> Spec:
    job, attempt = _int(msg, "job", 0), _int(msg, "attempt", 1)
    argv = msg.get("argv")
    if not isinstance(argv, list) or not argv or not _texts(argv):
        raise BadRequest("argv: a non-empty list of strings without NUL")
    env = msg.get("env", {})
    if not isinstance(env, dict) or not (_texts(env) and _texts(env.values())):
        raise BadRequest("env: an object of strings without NUL")
    for name in ("cwd", "stdout", "stderr"):
        if not _text(msg.get(name)) or not str(msg[name]).startswith("/"):
            raise BadRequest(f"{name}: an absolute path")
    uid, gid = _opt_int(msg, "uid"), _opt_int(msg, "gid")
    if (uid is None) != (gid is None):
        raise BadRequest("uid and gid are given together or not at all")
    groups = msg.get("groups")
    if groups is not None and not (
        isinstance(groups, list) and all(type(g) is int and g >= 0 for g in groups)
    ):
        raise BadRequest("groups: a list of group ids")
    index = msg.get("index")
    if index is not None and not (_text(index) and index.startswith("/")):
        raise BadRequest("index: an absolute path or null")
    adj = _opt_int(msg, "oom_score_adj", -1000)
    if adj is not None and adj > 1000:
        raise BadRequest("oom_score_adj: from -1000 to 1000")
    return Spec(
        job,
        attempt,
        tuple(argv),
        msg["cwd"],
        dict(env),
        msg["stdout"],
        msg["stderr"],
        uid,
        gid,
        None if groups is None else tuple(groups),
        adj,
        _opt_int(msg, "mem_max", 1),
        index,
    )


def parse_after(msg: dict[str, Any]) -> Key | None:
    """`after`: the attempt this spawn must wait for, {"job": J, "attempt": N}, or None.
    Exactly those two fields: a keeper that ignored one it did not know could start a
    job sooner than it was asked to."""
    after = msg.get("after")
    if after is None:
        return None
    if not isinstance(after, dict) or set(after) != {"job", "attempt"}:
        raise BadRequest('after: {"job": J, "attempt": N} or null')
    job, attempt = after["job"], after["attempt"]
    if type(job) is not int or type(attempt) is not int or job < 0 or attempt < 1:
        raise BadRequest("after: job an integer >= 0, attempt an integer >= 1")
    return (job, attempt)


def _text(value: object) -> bool:
    return isinstance(value, str) and "\0" not in value


def _texts(values: Iterable[object]) -> bool:
    """Whether all are strings without NUL: one join and one search, in C (a spawn's
    environment is dozens of them, checked at every spawn)."""
    try:
        return "\0" not in "".join(values)  # type: ignore[arg-type]  # TypeError: not str
    except TypeError:
        return False


def _int(msg: dict[str, Any], name: str, least: int) -> int:
    value = msg.get(name)
    if type(value) is not int or value < least:
        raise BadRequest(f"{name}: an integer >= {least}")
    return value


def _opt_int(msg: dict[str, Any], name: str, least: int = 0) -> int | None:
    return None if msg.get(name) is None else _int(msg, name, least)


@dataclass
class Forked:
    pid: int
    gate: int  # write GO to let the command run
    status: int  # EOF once the command exec'd; else the reason it could not start


def devnull() -> int:
    """The job's stdin: opened once for the keeper's life (close-on-exec), not per job."""
    global _DEVNULL
    if _DEVNULL < 0:
        _DEVNULL = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _DEVNULL


_DEVNULL = -1


def fork(spec: Spec, groups: cgroup.Groups, out: int, err: int) -> Forked:
    """Fork the job's child, which waits at the gate with `out` and `err` (the write ends
    of its relay pipes) as its stdout and stderr. Raises OSError (cgroup descriptors,
    pipes, fork) with nothing left behind."""
    fds: list[int] = []
    gate_w = status_r = -1
    try:
        joins = cgroup.join_fds(groups)
        fds.extend(joins)
        gate_r, gate_w = os.pipe()
        fds.append(gate_r)
        status_r, status_w = os.pipe()
        fds.append(status_w)
        null = devnull()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child execs or exits
            _child(spec, null, (out, err), joins, gate_r, status_w)
        for fd in fds:
            os.close(fd)
        fds = []
    except BaseException:
        for fd in fds:
            os.close(fd)
        for fd in (gate_w, status_r):
            if fd >= 0:
                os.close(fd)
        raise
    return Forked(pid, gate_w, status_r)


def _child(
    spec: Spec, null: int, sink: tuple[int, int], joins: list[int], gate: int, status: int
) -> None:  # pragma: no cover - runs between fork and exec
    """Never returns. Order matters: oom_score_adj and the cgroups while still
    privileged, then the user's ids, then the cwd as that user, so root lends nothing.
    Everything but the read of the gate comes before it: the keeper opens the gate as
    soon as the start is written, and each moment this child lives on the keeper's
    pages costs the keeper a copy of every page it writes meanwhile."""
    stage = "cannot start the job"
    try:
        signal.set_wakeup_fd(-1)
        for sig in JOB_DEFAULTS:
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        _own_oom_score_adj(spec.oom_score_adj)
        for fd in joins:
            os.write(fd, b"0")
        os.dup2(null, 0)
        os.dup2(sink[0], 1)
        os.dup2(sink[1], 2)
        # Nothing of the keeper's may reach the job, nor wait here with it: its descriptors
        # are close-on-exec, but another child's gate held open in this one would outlive
        # a keeper that died, and that child would wait for this one.
        _close_all_but(min(gate, status), max(gate, status))
        if spec.uid is not None and spec.gid is not None:
            os.setgroups(list(spec.groups or ()))
            os.setresgid(spec.gid, spec.gid, spec.gid)
            os.setresuid(spec.uid, spec.uid, spec.uid)
        who = "" if spec.uid is None else f" as uid {spec.uid}"
        stage = f"cannot enter working directory {spec.cwd}{who}"
        os.chdir(spec.cwd)
        stage = "the keeper went away before the start was recorded"
        if os.read(gate, 1) != GO:
            os._exit(127)
        stage = "exec"
        os.execvpe(spec.argv[0], list(spec.argv), spec.env)
    except BaseException as exc:
        message = why(stage, spec.argv[0], exc)
        mark = TRANSIENT.decode() if transient(exc) else ""
        try:
            if stage.startswith("cannot enter"):  # the job's own stderr says which; the
                os.write(2, f"gpusv: {message}\n".encode(errors="replace"))  # answer never
                message = f"{stage}: missing or not permitted (the job's stderr says which)"
            os.write(status, (mark + message).encode(errors="replace"))  # missing or not yours
        finally:
            os._exit(127)
    os._exit(127)


def _own_oom_score_adj(value: int | None) -> None:  # pragma: no cover - in the child
    """Inherited at fork, so always written: a keeper may run far below its jobs."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(0 if value is None else value).encode())
        finally:
            os.close(fd)
    except OSError:
        if value is not None:  # asked for: the job does not run without it
            raise


def why(stage: str, exe: str, exc: BaseException) -> str:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if stage != "exec":
        return f"{stage}: {reason}"
    if isinstance(exc, FileNotFoundError):
        return f"executable not found: {exe}"
    if isinstance(exc, PermissionError):
        return f"permission denied executing {exe}"
    return f"cannot start {exe[:80]}: {reason}"


def _close_all_but(low: int, high: int) -> None:  # pragma: no cover - in the child
    # os.closerange is one close_range(2) where the kernel has it (5.9+).
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))


def open_gate(gate: int) -> None:
    """Let the gated child run its command (its start is written)."""
    try:
        os.write(gate, GO)
    except BrokenPipeError:
        pass  # the child failed its setup and is gone: its exit says why
    finally:
        os.close(gate)


def open_failure(exc: OSError) -> str:
    return f"cannot start the job: {exc.strerror}"
