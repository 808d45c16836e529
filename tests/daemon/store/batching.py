"""Helpers for the group commit's tests (test_writer*.py): what another connection sees,
and a batch written from one loop turn behind a lead write."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio

from supervisor.daemon.store.writer import Writer


def committed(path: Path) -> list[str]:
    """What another connection sees: only what was committed."""
    with sqlite3.connect(path) as other:
        return [k for (k,) in other.execute("SELECT k FROM t ORDER BY k")]


async def batch(w: Writer, ops: dict[str, object]) -> dict[str, object]:
    """The ops written from one loop turn after a lead write: the lead commits alone, by
    itself; the others queue while its commit is in flight, and the writer commits them
    together. Each op's result, or the exception it raised, by name ("lead" included)."""
    results: dict[str, object] = {}

    async def call(name: str, op: object) -> None:
        try:
            results[name] = await w.write(op)  # type: ignore[arg-type]
        except Exception as exc:
            results[name] = exc

    def lead(db: sqlite3.Connection) -> str:
        db.execute("INSERT INTO t VALUES ('l0')")
        return "lead"

    async with anyio.create_task_group() as tg:
        await tg.start(w.run_writer)
        for name, op in (("lead", lead), *ops.items()):
            tg.start_soon(call, name, op)
        with anyio.fail_after(10):
            while len(results) < len(ops) + 1:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    return results
