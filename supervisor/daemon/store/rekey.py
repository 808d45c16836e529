"""Memory keys of a database written before the key named the kind of job, recomputed
once, so that the history of each kind is still found.

A job whose key is what the earlier rule derived from its command gets today's key
(from its command, working directory and PATH), and so do its attempts, which carry the
history. A job that had `--mem-key` keeps it. Done once per database, at open, in one
transaction, and marked done in `store_marks`.

Today's key looks the job's program up on its PATH, and a directory there may not answer
(a network file system whose server is gone). The lookups run in a thread of their own
(programs.in_thread); past LOOKUP_DEADLINE_S the keys are worked out with what was
found by then, a program not yet found taken as not found, and said: a daemon's start
must not wait on a file system that may never answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import aiosqlite
import anyio
import structlog

from supervisor.core.memkey import Which, mem_key
from supervisor.core.memkey_legacy import legacy_mem_key
from supervisor.daemon.programs import LOOKUP_DEADLINE_S, in_thread, program_finder
from supervisor.daemon.store.schema import ENV_TEXT

MARK = "mem_keys_name_the_kind"
Row = tuple[int, str, "str | None", str]  # id, spec, environment, key
Finder = Callable[["str | None"], Which]

log = structlog.get_logger("gpusvd.store")


async def rekey(db: aiosqlite.Connection, deadline_s: float = LOOKUP_DEADLINE_S) -> int:
    """Recompute derived keys unless done before; the number of jobs whose key changed."""
    await db.execute("CREATE TABLE IF NOT EXISTS store_marks (name TEXT PRIMARY KEY)")
    async with db.execute("SELECT 1 FROM store_marks WHERE name=?", (MARK,)) as cur:
        if await cur.fetchone():
            await db.commit()
            return 0
    await db.execute("BEGIN IMMEDIATE")
    async with db.execute(f"SELECT id, spec, {ENV_TEXT}, mem_key FROM jobs") as cur:
        rows: list[Row] = [tuple(row) async for row in cur]  # type: ignore[misc]
    found: dict[tuple[str | None, str], str | None] = {}

    def looking(path: str | None) -> Which:
        which = program_finder(path)

        def look(name: str) -> str | None:
            found[path, name] = hit = which(name)
            return hit

        return look

    try:
        with anyio.fail_after(deadline_s):
            changed = await in_thread(lambda: _changes(rows, looking), "rekey lookups")
    except TimeoutError:
        changed = _changes(rows, lambda path: lambda name: found.get((path, name)))
        log.warning(
            "memory keys: a PATH did not answer; programs not found by then are taken as "
            "missing in the keys of the earlier rule's jobs",
            deadline_s=deadline_s,
            jobs=len(rows),
        )
    await db.executemany(
        "UPDATE jobs SET mem_key=?1, spec=json_set(spec, '$.mem_key', ?1) WHERE id=?2", changed
    )
    await db.executemany("UPDATE attempts SET mem_key=? WHERE job_id=?", changed)
    await db.execute("INSERT INTO store_marks (name) VALUES (?)", (MARK,))
    await db.commit()
    return len(changed)


def _changes(rows: list[Row], finder: Finder) -> list[tuple[str, int]]:
    finders: dict[str | None, Which] = {}
    changed = []
    for job_id, spec_text, env_text, key in rows:
        new = _today(spec_text, env_text, key, finders, finder)
        if new is not None and new != key:
            changed.append((new, job_id))
    return changed


def _today(
    spec_text: str,
    env_text: str | None,
    key: str,
    finders: dict[str | None, Which],
    finder: Finder,
) -> str | None:
    """Today's key for a job whose key the earlier rule derived; None: keep its own."""
    try:
        spec = json.loads(spec_text)
        argv = [str(w) for w in spec["argv"]]
        if not argv or legacy_mem_key(argv) != key:
            return None  # `--mem-key`: the user's own name for the kind
        env = json.loads(env_text) if env_text else {}
        path = env.get("PATH") if isinstance(env, dict) else None
        which = finders.get(path) or finders.setdefault(path, finder(path))
        return mem_key(argv, cwd=spec.get("cwd"), which=which)
    except (ValueError, KeyError, TypeError):
        return None  # a row this rule cannot read keeps its key
