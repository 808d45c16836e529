"""Scheduling cost as the queue grows, measured in-process on the real engine and dispatch loop.

The daemon's own dispatch code runs here unchanged (Engine, Dispatcher, admission.plan, Store on
a real SQLite file); only the launch of a process is left out, so that what is timed is
the pass itself and not a fork. The situation is the one a busy box is in: both cards
run long jobs, N GPU jobs wait for them, and a `--gpus 0` job arrives that fits a free
CPU slot. Timed: the pass that starts it ("dispatch"), a pass with nothing to start
("idle pass", what every wake-up costs), the first pass after the N jobs arrived
(which records each one's hold once), and the pass after a GPU job ends, which gives
its card to the next GPU job ("card frees"). All sizes live in one process and are
measured in turns, so that they differ only in their queues.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from supervisor.core import admission
from supervisor.core.commands import Ended, SubmitJobs
from supervisor.core.jobs import ExitStatus, JobSpec
from supervisor.core.memkey import mem_key
from supervisor.core.outcome import Facts
from supervisor.daemon.broker import Broker
from supervisor.daemon.config import load
from supervisor.daemon.dispatcher import Dispatcher
from supervisor.daemon.engine import Engine, submitted_ids
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.watch.memory import available_mb, read_meminfo

from .harness import summary

CHUNK = 10_000


def _spec(gpus: int, argv: tuple[str, ...] = ("true",)) -> JobSpec:
    return JobSpec(
        argv=argv,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        owner_uid=os.geteuid(),
        owner_gid=os.getegid(),
        gpus=gpus,
        mem_key=mem_key(argv),
    )


def _scheduler(root: Path, store: Store) -> Dispatcher:
    """The engine and the dispatch loop, with no runner: a claimed job gets no process,
    since the pass is what is timed."""
    cfg = load(
        None,
        flags={"state_dir": str(root / "state"), "socket": str(root / "unused.sock")},
        env={},
        uid=os.geteuid(),
    )
    broker = Broker()
    engine = Engine(store, broker)
    book = MemoryBook(store, broker, cfg.host_memory.margin)
    cards = [admission.Card(i, 24_576, 0, True, ()) for i in range(2)]
    cfg = dataclasses.replace(cfg, cpu_slots=2)
    return Dispatcher(
        cfg,
        engine,
        book,
        broker,
        cards=lambda: cards,
        rss_mb=lambda _: 0,
        mem_total_mb=read_meminfo().total_mb,
        available_mb=available_mb,
    )


async def _submit(sched: Dispatcher, specs: list[JobSpec]) -> list[int]:
    return submitted_ids(await sched.engine.do(SubmitJobs(tuple(specs))))


async def _end(sched: Dispatcher, job_id: int) -> None:
    """The started job ends at once, as the runner would report it."""
    n = sched.table.live[job_id].attempt.n
    await sched.engine.do(Ended(job_id, n, Facts(ExitStatus(0, None))))


async def _card_frees(sched: Dispatcher, repeats: int) -> list[float]:
    """A GPU job ends and the pass gives its card to the next one in the queue."""
    out = []
    for _ in range(repeats):
        await _end(sched, next(j for j, r in sched.table.live.items() if r.cards))
        began = time.perf_counter()
        await sched.dispatch_pass()
        out.append(time.perf_counter() - began)
        assert sum(1 for r in sched.table.live.values() if r.cards) == 2, "a GPU job should start"
    return out


async def _fill(sched: Dispatcher, queued: int) -> float:
    """Both cards busy, `queued` GPU jobs behind them; returns the first pass's seconds."""
    await _submit(sched, [_spec(1, ("sleep", "3600")) for _ in range(2)])
    await sched.dispatch_pass()
    assert len(sched.table.live) == 2, "both cards should be busy"
    for start in range(0, queued, CHUNK):
        await _submit(sched, [_spec(1)] * min(CHUNK, queued - start))
    began = time.perf_counter()
    await sched.dispatch_pass()
    return time.perf_counter() - began


async def _round(sched: Dispatcher) -> tuple[float, float]:
    """A CPU job arrives and is dispatched (timed), ends, and a pass finds nothing (timed)."""
    (job_id,) = await _submit(sched, [_spec(0)])
    began = time.perf_counter()
    await sched.dispatch_pass()
    dispatch = time.perf_counter() - began
    assert job_id in sched.table.live, "the CPU job should have started"
    await _end(sched, job_id)
    began = time.perf_counter()
    await sched.dispatch_pass()
    return dispatch, time.perf_counter() - began


async def _measure(root: Path, queues: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """Every size set up first, then measured in turns: each round gives every size the
    same process (heap, caches, GC), so that only the queue differs between them."""
    stores = [await Store.open(root / f"{n}.db") for n in queues]
    try:
        async with anyio.create_task_group() as tg:
            for store in stores:
                await tg.start(store.run_writer)
            scheds = [_scheduler(root, store) for store in stores]
            firsts = [await _fill(sched, n) for sched, n in zip(scheds, queues, strict=True)]
            times: list[list[tuple[float, float]]] = [[] for _ in queues]
            for _ in range(repeats):
                for sched, out in zip(scheds, times, strict=True):
                    out.append(await _round(sched))
            freed = [await _card_frees(sched, 3) for sched in scheds]
            tg.cancel_scope.cancel()
    finally:
        for store in stores:
            await store.close()
    return [
        {
            "queued": n,
            "dispatch_ms": summary([d for d, _ in pairs]),
            "idle_pass_ms": summary([i for _, i in pairs]),
            "first_pass_ms": round(first * 1000, 1),
            "card_frees_ms": summary(f),
        }
        for n, pairs, first, f in zip(queues, times, firsts, freed, strict=True)
    ]


def dispatch_cost(root: Path, queues: tuple[int, ...], repeats: int = 200) -> list[dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=True)
    return anyio.run(_measure, root, queues, repeats)


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sizes = tuple(int(a) for a in sys.argv[1:]) or (100, 10_000)
        for row in dispatch_cost(Path(tmp), sizes):
            print(row)
