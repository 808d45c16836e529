"""A submit's programs looked up on its PATH off the event loop: the keys are those of a
lookup on the loop, and a PATH that does not answer costs that submit an error after
the deadline, never the loop. A file system that does not answer is real where this
runs as root (tests/hung_fs.py); the finder stand-in, which blocks as a `stat` on it
does, tells the lookups' bookkeeping apart; the threads are real."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import anyio
import pytest

from supervisor.core.memkey import Which, mem_key
from supervisor.daemon.programs import Lookups, program_finder
from supervisor.wire.protocol import ProtocolError
from tests import hung_fs

PATH = os.environ.get("PATH", os.defpath)
ARGVS = [
    ("true",),
    ("sh", "train.sh", "--lr", "1"),
    ("env", "A=1", "python3", "x.py"),
    ("nohup", "nice", "sh", "-c", "echo"),
    ("/bin/sh", "y.sh"),
    ("no-such-program-here", "z"),
    ("true",),
]


class Stuck:
    """A finder whose lookups of `stuck` wait until released; the others are real."""

    def __init__(self, stuck: str = "sh") -> None:
        self.stuck = stuck
        self.released = threading.Event()
        self.waiting = 0
        self.asked: list[str] = []

    def __call__(self, path: str | None) -> Which:
        real = program_finder(path)

        def which(name: str) -> str | None:
            self.asked.append(name)
            if name == self.stuck:
                self.waiting += 1
                self.released.wait(30)
                self.waiting -= 1
            return real(name)

        return which


@pytest.fixture
def stuck() -> Iterator[Stuck]:
    finder = Stuck()
    yield finder
    finder.released.set()  # the threads left behind finish


async def _ticks_during(work: Callable[[], Awaitable[object]]) -> tuple[int, float]:
    """How often the loop turned (every 10 ms) while `work` ran, and how long it took."""
    ticks = 0
    began = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def tick() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.01)
                ticks += 1

        tg.start_soon(tick)
        try:
            await work()
        finally:
            tg.cancel_scope.cancel()
    return ticks, time.monotonic() - began


async def test_the_keys_are_those_of_a_lookup_on_the_loop() -> None:
    keys = await Lookups().mem_keys(ARGVS, None, "/w", PATH)
    which = program_finder(PATH)
    assert keys == {argv: mem_key(argv, cwd="/w", which=which) for argv in ARGVS}
    assert len(keys) == len(set(ARGVS))


async def test_a_given_key_looks_nothing_up() -> None:
    def finder(path: str | None) -> Which:
        raise AssertionError("looked up")

    keys = await Lookups(finder=finder).mem_keys(ARGVS, " k ", "/w", PATH)
    assert set(keys.values()) == {"k"}


async def test_each_name_is_looked_up_once_and_taken_as_found_for_a_while() -> None:
    finder = Stuck(stuck="")
    lookups = Lookups(finder=finder, found_for_s=0.3)
    keys = await lookups.mem_keys(ARGVS * 50, None, "/w", PATH)
    assert sorted(finder.asked) == sorted(set(finder.asked))
    assert {"true", "sh"} <= set(finder.asked)
    asked = len(finder.asked)
    assert await lookups.mem_keys(ARGVS, None, "/w", PATH) == keys  # found a moment ago
    assert len(finder.asked) == asked
    await lookups.mem_keys(ARGVS, None, "/w", "/nowhere")  # another PATH: its own lookups
    assert len(finder.asked) > asked
    asked = len(finder.asked)
    await anyio.sleep(0.35)
    assert await lookups.mem_keys(ARGVS, None, "/w", PATH) == keys  # looked up again
    assert len(finder.asked) == asked + len(set(finder.asked))


async def test_a_path_that_does_not_answer_refuses_the_submit_and_the_loop_turns_on(
    stuck: Stuck,
) -> None:
    lookups = Lookups(deadline_s=0.3, finder=stuck)

    async def submit() -> None:
        with pytest.raises(ProtocolError) as refused:
            await lookups.mem_keys([("sh", "train.sh")], None, "/w", PATH)
        assert refused.value.code == "bad_request"
        assert "PATH" in refused.value.message and "--mem-key" in refused.value.message

    ticks, took = await _ticks_during(submit)
    assert 0.3 <= took < 5
    assert ticks >= 10  # the loop was free all along (30 turns of 10 ms at best)
    assert stuck.waiting == 1  # its thread waits on, left behind
    # Other submits are served meanwhile: one whose programs are elsewhere is keyed.
    assert await lookups.mem_keys([("true",)], None, "/w", PATH)


async def test_a_path_through_a_file_system_that_does_not_answer_refuses_the_submit(
    hung: hung_fs.Hung,
) -> None:
    lookups = Lookups(deadline_s=0.3)

    async def submit() -> None:
        with pytest.raises(ProtocolError, match="does not answer"):
            await lookups.mem_keys([("tool", "x")], None, "/w", f"{hung.path}/bin:{PATH}")

    ticks, took = await _ticks_during(submit)
    assert 0.3 <= took < 5 and ticks >= 10
    assert lookups.busy == 1  # its thread waits in the kernel, left behind
    hung.release()  # it fails now, and the thread ends
    await _eventually(lambda: lookups.busy == 0)


async def _eventually(done: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not done():
            await anyio.sleep(0.01)


async def test_stuck_lookups_hold_at_most_their_threads_and_the_next_waits_within_its_deadline(
    stuck: Stuck,
) -> None:
    lookups = Lookups(deadline_s=0.2, threads=1, finder=stuck)
    with pytest.raises(ProtocolError):
        await lookups.mem_keys([("sh",)], None, "/w", PATH)
    began = time.monotonic()
    with pytest.raises(ProtocolError):  # no thread free: it waits for one, then gives up
        await lookups.mem_keys([("true",)], None, "/w", PATH)
    assert time.monotonic() - began < 5
    assert stuck.waiting == 1
    stuck.released.set()  # the file system answers again: the thread is free
    with anyio.fail_after(10):
        while stuck.waiting:
            await anyio.sleep(0.01)
    keys = await lookups.mem_keys([("sh", "a.sh"), ("true",)], None, "/w", PATH)
    assert keys[("true",)] == mem_key(("true",), cwd="/w", which=program_finder(PATH))


def test_a_lookup_left_behind_does_not_hold_the_process_at_its_exit() -> None:
    """gpusvd's exit (a stop, a restart) must not wait for a `stat` that never returns."""
    import subprocess
    import sys

    code = """
import threading, anyio
from supervisor.daemon.programs import Lookups
from supervisor.wire.protocol import ProtocolError
from tests import hung_fs
never = threading.Event()
def finder(path):
    return lambda name: never.wait()
async def main():
    try:
        await Lookups(deadline_s=0.2, finder=finder).mem_keys([("sh",)], None, "/w", None)
    except ProtocolError:
        print("refused", flush=True)
anyio.run(main)
"""
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "refused\n", out.stderr
    assert time.monotonic() - began < 20
