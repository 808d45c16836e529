"""Where a job's program is: the memory key names a program by one path.

Finding it reads the directories of the submitter's PATH, and one of them may never
answer (a network file system whose server is gone: a `stat` there waits in the kernel
for as long as the mount says). So a submit's lookups run in worker threads, never on
the event loop: the keys are worked out on the loop with what is known, each name not
yet known is looked up in a thread, and the keys are worked out again with it. A submit
whose lookups have not finished within LOOKUP_DEADLINE_S is refused, nothing changed,
while gpusvd serves everyone else; the thread that waits is left to finish (nothing can
stop a call the kernel holds), and at most LOOKUP_THREADS wait at once, after which a
submit that needs a lookup waits for one of them, within the same deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from functools import cache
from typing import TypeVar

import anyio

from supervisor.core.memkey import Which, mem_key
from supervisor.wire import protocol
from supervisor.wire.protocol import ProtocolError

LOOKUP_DEADLINE_S = 10.0
LOOKUP_THREADS = 4
FOUND_FOR_S = 5.0  # a program found is taken as found this long (a shell's hash: forever)
FOUND_KEPT = 1024
# Each pass finds the names that the keys' words lead to; a name found can lead to
# another (a wrapper's program), so a few passes, then what is still unknown is missing.
LOOKUP_PASSES = 4

Argv = tuple[str, ...]
T = TypeVar("T")


def program_finder(path: str | None) -> Which:
    """A program found on a job's PATH (`os.defpath` when it has none), as one path
    with symlinks resolved, so that `python3` and `/usr/bin/python3` are one program.
    Each name is looked up once per finder: a batch of a thousand lines reads the file
    system a few times, not a thousand."""
    search = os.defpath if path is None else path

    @cache
    def which(name: str) -> str | None:
        found = shutil.which(name, path=search)
        return os.path.realpath(found) if found else None

    return which


class Lookups:
    """The memory keys of a submit's commands, their programs looked up off the loop."""

    def __init__(
        self,
        deadline_s: float = LOOKUP_DEADLINE_S,
        threads: int = LOOKUP_THREADS,
        finder: Callable[[str | None], Which] = program_finder,
        found_for_s: float = FOUND_FOR_S,
    ) -> None:
        self.deadline_s = deadline_s
        self.finder = finder  # a seam: tests hold a lookup where they choose
        self.threads = threads
        # Threads looking up now, counted on the loop from their start until their answer
        # comes back: one left behind at the deadline still counts.
        self.busy = 0
        self._freed = asyncio.Event()  # set (and made anew) as each one's answer comes back
        # What the last lookups found, by (PATH, name): a run of submits from a script
        # looks each program up once every FOUND_FOR_S, not once a submit.
        self.found_for_s = found_for_s
        self._found: dict[str | None, dict[str, tuple[str | None, float]]] = {}

    async def mem_keys(
        self, argvs: Iterable[Argv], explicit: str | None, cwd: str, path: str | None
    ) -> dict[Argv, str]:
        """Each distinct command's memory key (`explicit` for all, when given: no lookup);
        ProtocolError `bad_request` when the lookups did not finish in time."""
        distinct = list(dict.fromkeys(argvs))
        if explicit is not None and explicit.strip():
            return {argv: mem_key(argv, explicit) for argv in distinct}
        found = self._recent(path)
        keys: dict[Argv, str] = {}
        which = self.finder(path)
        with anyio.move_on_after(self.deadline_s):
            todo = distinct
            for _ in range(LOOKUP_PASSES):
                todo, missing = _keys(todo, cwd, found, keys)
                if not todo:
                    return keys
                while self.busy >= self.threads:
                    await self._freed.wait()
                looked = await self._in_thread(which, sorted(missing))
                found.update(looked)
                self._remember(path, looked)
            while todo:  # led to by names found in the last pass: taken as not found
                todo, missing = _keys(todo, cwd, found, keys)
                found.update(dict.fromkeys(missing))
            return keys
        raise ProtocolError(
            protocol.BAD_REQUEST,
            f"the job's program was not looked up on its PATH within {self.deadline_s:g} s: "
            "a directory on PATH does not answer (a network file system?); "
            "fix PATH, or name the program by its path, or give --mem-key",
        )

    def _recent(self, path: str | None) -> dict[str, str | None]:
        since = time.monotonic() - self.found_for_s
        return {name: hit for name, (hit, at) in self._found.get(path, {}).items() if at > since}

    def _remember(self, path: str | None, looked: dict[str, str | None]) -> None:
        if sum(map(len, self._found.values())) + len(looked) > FOUND_KEPT:
            self._found.clear()  # many programs, or many PATHs: forget them all at once
        now = time.monotonic()
        self._found.setdefault(path, {}).update({n: (hit, now) for n, hit in looked.items()})

    async def _in_thread(self, which: Which, names: list[str]) -> dict[str, str | None]:
        def freed() -> None:
            self.busy -= 1
            self._freed.set()
            self._freed = asyncio.Event()

        done = in_thread(lambda: {name: which(name) for name in names}, "PATH lookup", freed)
        self.busy += 1
        return await done


def in_thread(
    work: Callable[[], T], name: str, answered: Callable[[], None] = lambda: None
) -> asyncio.Future[T]:
    """`work()` in a daemon thread of its own, its outcome as a future of the loop, and
    `answered` called on the loop once it comes back. One left behind at a deadline (a
    lookup the kernel holds) must not hold gpusvd's exit: the interpreter waits for every
    other thread, anyio's workers among them."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        answered()
        if not done.done():  # cancelled meanwhile: nobody waits for it
            outcome()

    def run() -> None:
        try:
            value = work()
        except BaseException as exc:  # handed to the task that waits
            answer = functools.partial(settle, functools.partial(done.set_exception, exc))
        else:
            answer = functools.partial(settle, functools.partial(done.set_result, value))
        with contextlib.suppress(RuntimeError):  # the loop has closed: gpusvd is leaving
            loop.call_soon_threadsafe(answer)

    threading.Thread(target=run, name=f"gpusvd {name}", daemon=True).start()
    return done


def _keys(
    argvs: list[Argv], cwd: str, found: dict[str, str | None], keys: dict[Argv, str]
) -> tuple[list[Argv], set[str]]:
    """Into `keys`, those of `argvs` whose programs are all known by now; the others,
    and the names to look up for them."""
    missing: set[str] = set()
    missed = False

    def which(name: str) -> str | None:
        nonlocal missed
        if name in found:
            return found[name]
        missing.add(name)
        missed = True
        return None

    todo = []
    for argv in argvs:
        missed = False
        key = mem_key(argv, cwd=cwd, which=which)
        if missed:
            todo.append(argv)
        else:
            keys[argv] = key
    return todo, missing
