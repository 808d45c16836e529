"""Memory keys of a database written before the key named the kind of job, recomputed
once, so that the history of each kind is still found.

A job whose key is what the earlier rule derived from its command gets today's key
(from its command, working directory and PATH), and so do its attempts, which carry the
history. A job that had `--mem-key` keeps it. Done once per database, at open, in one
transaction, and marked done in `store_marks`.
"""

from __future__ import annotations

import json

import aiosqlite

from supervisor.core.memkey import Which, mem_key
from supervisor.core.memkey_legacy import legacy_mem_key
from supervisor.daemon.programs import program_finder
from supervisor.daemon.store.schema import ENV_TEXT

MARK = "mem_keys_name_the_kind"


async def rekey(db: aiosqlite.Connection) -> int:
    """Recompute derived keys unless done before; the number of jobs whose key changed."""
    await db.execute("CREATE TABLE IF NOT EXISTS store_marks (name TEXT PRIMARY KEY)")
    async with db.execute("SELECT 1 FROM store_marks WHERE name=?", (MARK,)) as cur:
        if await cur.fetchone():
            await db.commit()
            return 0
    await db.execute("BEGIN IMMEDIATE")
    changed: list[tuple[str, int]] = []
    finders: dict[str | None, Which] = {}
    async with db.execute(f"SELECT id, spec, {ENV_TEXT}, mem_key FROM jobs") as cur:
        async for job_id, spec_text, env_text, key in cur:
            new = _today(spec_text, env_text, key, finders)
            if new is not None and new != key:
                changed.append((new, job_id))
    await db.executemany(
        "UPDATE jobs SET mem_key=?1, spec=json_set(spec, '$.mem_key', ?1) WHERE id=?2", changed
    )
    await db.executemany("UPDATE attempts SET mem_key=? WHERE job_id=?", changed)
    await db.execute("INSERT INTO store_marks (name) VALUES (?)", (MARK,))
    await db.commit()
    return len(changed)


def _today(
    spec_text: str, env_text: str | None, key: str, finders: dict[str | None, Which]
) -> str | None:
    """Today's key for a job whose key the earlier rule derived; None: keep its own."""
    try:
        spec = json.loads(spec_text)
        argv = [str(w) for w in spec["argv"]]
        if not argv or legacy_mem_key(argv) != key:
            return None  # `--mem-key`: the user's own name for the kind
        env = json.loads(env_text) if env_text else {}
        path = env.get("PATH") if isinstance(env, dict) else None
        which = finders.get(path) or finders.setdefault(path, program_finder(path))
        return mem_key(argv, cwd=spec.get("cwd"), which=which)
    except (ValueError, KeyError, TypeError):
        return None  # a row this rule cannot read keeps its key
