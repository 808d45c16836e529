"""`python -m supervisor.keeper DIR [--cgroup2 PATH] [--memcg PATH] [--detach]`

DIR is the keeper's own directory (0700): its lock, journal, socket and log. With
--detach the process forks once it listens, and the parent exits 0: whoever started it
knows then that the socket answers. Exit 3: another keeper holds DIR (it serves).
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import os
import socket
import sys
from pathlib import Path
from typing import NamedTuple, NoReturn

from . import cgroup, scope
from .cgroup import Roots
from .direct import Home
from .jobs import Jobs
from .journal import Journal
from .log import log_line
from .server import Server
from .takeover import take_over

PR_SET_CHILD_SUBREAPER = 36
EXIT_HELD = 3


def become_subreaper() -> bool:
    """Orphans of our jobs come back to us, not to init: reaped at once, never zombies
    under someone else, and still ours to find where there is no cgroup."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _listen(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)  # we hold the lock: any socket file here is stale
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


USAGE = "usage: python -m supervisor.keeper DIR [--cgroup2 PATH] [--memcg PATH] [--detach]"


class Args(NamedTuple):
    dir: Path
    cgroup2: Path | None  # make each job's unified cgroup here
    memcg: Path | None  # make each job's v1 memory cgroup here
    detach: bool


def parse_args(argv: list[str]) -> Args:
    """By hand, not argparse: argparse's help formatter brings shutil and three
    compression libraries along, and every fork of the keeper copies their mappings."""
    home: Path | None = None
    roots: dict[str, Path] = {}
    detach, rest = False, list(argv)
    while rest:
        word = rest.pop(0)
        name, eq, value = word.partition("=")
        if word in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        elif word == "--detach":
            detach = True
        elif name in ("--cgroup2", "--memcg"):
            if not eq:
                if not rest:
                    _usage_error(f"{name}: expected one argument")
                value = rest.pop(0)
            roots[name] = Path(value)
        elif word.startswith("-") or home is not None:
            _usage_error(f"unrecognized arguments: {word}")
        else:
            home = Path(word)
    if home is None:
        _usage_error("the following arguments are required: dir")
    return Args(home, roots.get("--cgroup2"), roots.get("--memcg"), detach)


def _usage_error(message: str) -> NoReturn:
    sys.stderr.write(f"{USAGE}\npython -m supervisor.keeper: error: {message}\n")
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    home = args.dir
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    if args.cgroup2 is not None:
        try:  # in a scope of our own (scope.py): into our leaf, beside our jobs' root
            scope.move_into_leaf(args.cgroup2)
        except OSError as exc:
            log_line(f"cannot move into a leaf beside {args.cgroup2}: {exc.strerror}")
    lock = os.open(home / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return EXIT_HELD
    for root in (args.cgroup2, args.memcg):
        if root is not None:  # where it cannot be made, each job is refused (cgroup.make)
            cgroup.ensure_root(str(root), log_line)
    if args.cgroup2 is not None:
        cgroup.offer_memory(str(args.cgroup2), log_line)
    roots = Roots(*(None if root is None else str(root) for root in (args.cgroup2, args.memcg)))
    if not become_subreaper():
        log_line("cannot become a child subreaper: orphans of jobs go to init")
    jobs = Jobs(Journal(home / "journal", log=log_line), roots, log_line)
    take_over(jobs)
    listener = _listen(home / "sock")
    if args.detach and os.fork() != 0:
        os._exit(0)  # the caller's wait ends here: the socket already listens
    if args.detach:
        os.setsid()
        become_subreaper()  # a fork does not inherit it
    log_line(f"serving {home} (cgroup2 {roots.v2}, memcg {roots.memcg})")
    if roots.v2 is not None or roots.memcg is not None:
        jobs.direct, why = Home.probe(roots)  # after the detach: /proc/self is this process
        how = "jobs of this user start with posix_spawn" if jobs.direct else "jobs start by fork"
        log_line(how if jobs.direct else f"{how}: {why}")
    server = Server(jobs, listener, log_line)
    # Every fork write-protects the keeper's pages until the child execs; the collector
    # walking start-up's objects would then copy pages for nothing. They live for good.
    gc.freeze()
    server.serve()
    (home / "sock").unlink(missing_ok=True)
    _remove_roots(roots)
    log_line("no jobs left to keep: exiting")
    return 0


def _remove_roots(roots: Roots) -> None:
    """Leaving with nothing kept (a drain let us go): our roots are empty, each job's
    group removed at its end, and ours to remove (the group above them is whoever gave
    them to us). What still holds a process or a group stays, and is said."""
    try:
        gone = cgroup.remove(cgroup.Groups(roots.v2, roots.memcg))
    except OSError as exc:
        gone, why = False, exc.strerror
    else:
        why = "a process or a group is still in one"
    if not gone:
        log_line(f"cgroup roots left in place ({roots.v2}, {roots.memcg}): {why}")


if __name__ == "__main__":
    sys.exit(main())
