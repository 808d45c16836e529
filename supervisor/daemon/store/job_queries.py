"""The job-row queries of the everyday verbs: `list`'s filters and `clean`.

A cleaned job keeps its row (its attempts reference it and feed the memory projections)
but leaves every listing; its logs are deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from supervisor.core.jobs import Job
from supervisor.daemon.clock import iso_from_epoch
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.schema import JOB_COLUMNS, _row_to_job, _Specs

FINISHED = "state IN ('succeeded', 'failed', 'cancelled')"


async def list_jobs(
    store: Store,
    states: Sequence[str],
    limit: int,
    before_id: int | None,
    *,
    owner_uid: int | None = None,
    ended_since: float | None = None,
    array: int | None = None,
    name: str | None = None,
    labels: Sequence[tuple[str, str]] = (),
) -> list[Job]:
    """Newest first; cleaned jobs never; with `ended_since` (epoch seconds), only active
    jobs and those that ended since; with `name`, those whose name matches that glob
    (SQLite's GLOB: * ? [...], case-sensitive, as a shell matches); with `labels`, those
    that carry every one of these labels."""
    where = ["cleaned_at IS NULL"]
    params: list[Any] = []
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        params.extend(states)
    if before_id is not None:
        where.append("id < ?")
        params.append(before_id)
    if owner_uid is not None:
        where.append("owner_uid = ?")
        params.append(owner_uid)
    if array is not None:
        where.append("json_extract(spec, '$.array_id') = ?")
        params.append(array)
    if name is not None:
        where.append("json_extract(spec, '$.name') GLOB ?")
        params.append(name)
    for key, value in labels:  # json_each: a key is matched as a value, never as a path
        where.append(
            "EXISTS (SELECT 1 FROM json_each(spec, '$.labels') WHERE key = ? AND value = ?)"
        )
        params.extend((key, value))
    if ended_since is not None:
        where.append("(state IN ('queued', 'running') OR ended_at >= ?)")
        params.append(iso_from_epoch(ended_since))
    rows = await store._all(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
        [*params, limit],
    )
    specs = _Specs()
    return [_row_to_job(r, specs) for r in rows]


async def cleanable(store: Store, owner_uid: int | None, ended_before: float) -> list[int]:
    """Finished jobs (of `owner_uid`, or everyone's) ended before then, not yet cleaned.
    Marking them is the engine's (`Forget`)."""
    where = [FINISHED, "cleaned_at IS NULL", "ended_at <= ?"]
    params: list[Any] = [iso_from_epoch(ended_before)]
    if owner_uid is not None:
        where.append("owner_uid = ?")
        params.append(owner_uid)
    rows = await store._all(f"SELECT id FROM jobs WHERE {' AND '.join(where)}", params)
    return [int(r[0]) for r in rows]
