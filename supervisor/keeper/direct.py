"""Start a job with posix_spawn(3): no Python runs between fork and exec.

A forked keeper child runs Python until it execs: it copies the keeper's pages it
touches, and the keeper, write-protected meanwhile, copies the pages it writes. That
cost more CPU per trivial job than the rest of its spawn (docs/performance.md).
posix_spawn (a vfork-style clone in glibc) borrows the keeper's memory until exec and
copies nothing. What the gated child did for itself is done around the call instead:

- cgroups: the keeper joins the job's cgroups, spawns, and goes back to its own; the
  child is born inside them, so nothing of the job ever runs outside its cgroup;
- oom_score_adj: the keeper takes the job's value for the call and then its own again
  (the child inherits it at clone);
- the working directory: the keeper enters it and returns to its own;
- stdin, stdout, stderr: file actions; every descriptor of the keeper's is close-on-exec;
- signals the keeper ignores are reset to their defaults, and the mask is emptied.

posix_spawn cannot change ids, so a job of another user keeps the gated fork (spawn.py),
which drops them before it enters the working directory. It cannot wait at a gate
either: the record that lets a successor find the job, the cgroup, is written before
the call (jobs.py). A keeper that cannot make a cgroup, or cannot leave one, keeps the
gated fork too: `Home.probe` tells.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

from . import cgroup
from .local_fs import LocalPaths
from .spawn import JOB_DEFAULTS, Spec, transient, why

# Python ignores SIGPIPE and SIGXFSZ, the keeper SIGHUP and SIGINT, and ignored signals
# stay ignored across exec; the keeper's own handlers (SIGCHLD, SIGTERM) are reset by
# exec anyway.
_DEFAULTS = JOB_DEFAULTS
PROBE_PREFIX = "probe-"  # the cgroup a keeper tries, at its start, to join and leave
_NO_JOIN = "cannot start the job: cannot join its cgroup: {}"


class NotNow(Exception):
    """This spawn cannot go this way (an oom_score_adj the keeper may not take): fork."""


class Failed(Exception):
    """Nothing of the command ran; the reason, as a gated child would have told it. With
    `stderr`, a line for the job's stderr as well."""

    def __init__(self, message: str, stderr: str = "", *, passing: bool = False) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.transient = passing  # a passing cause (EAGAIN, ENOMEM...): may be tried again


class Home:
    """Where the keeper returns after each spawn: its cgroups, working directory and
    oom_score_adj, held open for its life."""

    def __init__(self, procs: list[int], cwd: int, adj_fd: int, adj: int) -> None:
        self.procs = procs  # cgroup.procs of the keeper's own cgroups, one per root
        self.cwd = cwd
        self.adj_fd = adj_fd
        self.adj = self.current = adj
        self.broken = ""  # why this keeper must fork again, once something went wrong
        self.posix_spawn = os.posix_spawn  # a seam for a spawn that fails (EAGAIN)
        self.local: LocalPaths | None = None  # made at the first start

    @classmethod
    def probe(cls, roots: cgroup.Roots) -> tuple[Home | None, str]:
        """The keeper's home, once it has been into a cgroup under every root and back;
        or None, and why the gated fork stays."""
        mine = own_cgroups(roots)
        if mine is None:
            return None, "its own cgroups cannot be found"
        opened: list[int] = []
        try:
            for own in mine:
                opened.append(os.open(f"{own}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
            probe = f"{PROBE_PREFIX}{os.getpid()}"
            groups = cgroup.Groups(*(None if r is None else f"{r}/{probe}" for r in roots))
            for path in (groups.v2, groups.memcg):
                if path is not None:
                    os.makedirs(path, exist_ok=True)
            adj_fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
            opened.append(adj_fd)
            adj = int(os.read(adj_fd, 16))
            cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            opened.append(cwd)
        except (OSError, ValueError) as exc:
            for fd in opened:
                os.close(fd)
            return None, f"cannot hold its own cgroups: {exc}"
        home = cls(opened[:-2], cwd, adj_fd, adj)
        try:
            with home._inside(groups):
                pass
        except Failed as exc:
            home.broken = str(exc)
        finally:
            with contextlib.suppress(OSError):
                cgroup.remove(groups)
        if home.broken:
            for fd in opened:
                os.close(fd)
            return None, home.broken
        return home, ""

    def near(self, spec: Spec, warn: Callable[[str], None]) -> None:
        """Raises NotNow where this start would touch a file system that is not local
        (local_fs.py): the gated fork's child enters the directory and execs instead."""
        if self.local is None:
            self.local = LocalPaths()
        far = self.local.start(spec)
        if far is not None:
            warn(
                f"jobs whose directory or program is on {far} start by fork: "
                "a server that does not answer then holds only them, not this keeper"
            )
            raise NotNow(far)

    @contextlib.contextmanager
    def oom_score_adj(self, value: int | None) -> Iterator[None]:
        """The job's value, for its child to inherit, until the keeper's own comes back.
        A value the keeper may not take (lower, unprivileged) raises NotNow at once."""
        self._set_adj(0 if value is None else value)  # always: a keeper may run far below
        try:
            yield
        finally:
            try:
                self._set_adj(self.adj)
            except NotNow as exc:  # kept: the job's value, which is above the keeper's
                self.broken = f"cannot take its own oom_score_adj back: {exc}"

    def start(self, spec: Spec, groups: cgroup.Groups, out: int, err: int, null: int) -> int:
        """The job's pid, its command exec'd (inside oom_score_adj). Raises Failed when
        the command could not start: nothing of it ran."""
        with self._inside(groups):
            try:
                os.chdir(spec.cwd)
            except OSError as exc:
                stage = f"cannot enter working directory {spec.cwd}"
                raise Failed(
                    f"{stage}: missing or not permitted (the job's stderr says which)",
                    f"gpusv: {why(stage, spec.argv[0], exc)}\n",
                ) from None
            try:
                exe = _executable(spec)  # in the job's directory: PATH may be relative
                return self.posix_spawn(
                    exe,
                    list(spec.argv),
                    spec.env,
                    file_actions=[
                        (os.POSIX_SPAWN_DUP2, null, 0),
                        (os.POSIX_SPAWN_DUP2, out, 1),
                        (os.POSIX_SPAWN_DUP2, err, 2),
                    ],
                    setsid=True,
                    setsigdef=_DEFAULTS,
                    setsigmask=(),
                )
            except OSError as exc:
                raise Failed(why("exec", spec.argv[0], exc), passing=transient(exc)) from None
            finally:
                os.fchdir(self.cwd)

    @contextlib.contextmanager
    def _inside(self, groups: cgroup.Groups) -> Iterator[None]:
        try:
            joins = cgroup.join_fds(groups)
        except OSError as exc:
            raise Failed(_NO_JOIN.format(exc.strerror), passing=transient(exc)) from None
        try:
            try:
                for fd in joins:
                    os.write(fd, b"0")
            except OSError as exc:
                raise Failed(_NO_JOIN.format(exc.strerror), passing=True) from None
            yield
        finally:
            for fd in joins:
                os.close(fd)
            try:
                for fd in self.procs:
                    os.write(fd, b"0")
            except OSError as exc:  # the probe came back this way: not seen to happen
                self.broken = f"cannot go back to its own cgroup: {exc.strerror}"

    def _set_adj(self, value: int) -> None:
        if value == self.current:
            return
        try:
            os.write(self.adj_fd, str(value).encode())
        except OSError as exc:
            raise NotNow(f"oom_score_adj {value}: {exc.strerror}") from None
        self.current = value


def own_cgroups(roots: cgroup.Roots) -> list[str] | None:
    """This process's cgroup in the hierarchy of each root (v2, then v1 memory), from
    /proc/self/cgroup and the mount of that hierarchy; None when one cannot be found."""
    mounts = _cgroup_mounts()
    own = {}
    for line in _read("/proc/self/cgroup").splitlines():
        ident, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if ident == "0" and controllers == "":
            own["v2"] = path
        elif "memory" in controllers.split(","):
            own["memcg"] = path
    found = []
    for kind, root in (("v2", roots.v2), ("memcg", roots.memcg)):
        if root is None:
            continue
        mount = next((m for m in mounts[kind] if (root + "/").startswith(m + "/")), None)
        if mount is None or kind not in own:
            return None
        path = mount + own[kind].rstrip("/")
        if not os.path.isdir(path):
            return None
        found.append(path)
    return found


def _cgroup_mounts() -> dict[str, list[str]]:
    """Mount points of cgroup2, and of the v1 hierarchy that holds memory."""
    mounts: dict[str, list[str]] = {"v2": [], "memcg": []}
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            mounts["v2"].append(fields[4])
        elif tail[0] == "cgroup" and "memory" in tail[2].split(","):
            mounts["memcg"].append(fields[4])
    return mounts


FOUND_FOR_S = 1.0  # a PATH search is reused this long (one stat), as a shell's hash is
_found: dict[tuple[str, str | None, str], tuple[str, float]] = {}  # (name, PATH, cwd) -> path, at
_clock = time.monotonic


def _executable(spec: Spec) -> str:
    """argv[0] searched in the job's own PATH, as execvpe would: the first that may be
    executed; else why not (a file that may not be run, or none at all). A name found
    less than FOUND_FOR_S ago in the same PATH and directory is taken again while it
    may still be executed: a sweep of one command misses a dozen folders once a second,
    not at each job, and a binary installed earlier in the PATH is seen within that."""
    name = spec.argv[0]
    if "/" in name:
        return name
    # PATH as os.get_exec_path reads it from a str mapping, without the warnings filter
    # that get_exec_path sets up at each call: the folders are split only on a miss.
    key, now = (name, spec.env.get("PATH"), spec.cwd), _clock()
    path, at = _found.get(key, ("", 0.0))
    if path and now - at < FOUND_FOR_S and os.access(path, os.X_OK):
        return path
    denied = False
    for folder in os.get_exec_path(spec.env):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                if len(_found) >= 1024:  # many commands a second: forget them all at once
                    _found.clear()
                _found[key] = (path, now)
                return path
            denied = True
    if denied:
        raise Failed(why("exec", name, PermissionError(13, "Permission denied")))
    raise Failed(why("exec", name, FileNotFoundError(2, "No such file or directory")))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""
