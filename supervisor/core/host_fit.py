"""Whether a job's host-RAM figure can ever fit next to other jobs: told at submit.

Pure. A job whose figure is more than the jobs together may use (the `[host_memory]`
limit less the reserve) is not refused: the lone-job rule of admission starts it when
nothing else runs. Its submitter is told so at once, not after a wait.
"""

from __future__ import annotations

from supervisor.core.admission import gb
from supervisor.core.projection import Projection
from supervisor.core.records import Event

OVER_LIMIT = "mem_over_limit"


def over_limit(p: Projection | None, *, limit_mb: int, reserve_mb: int) -> Event | None:
    """The `mem_over_limit` event for a figure above `limit_mb - reserve_mb`, else None."""
    room = limit_mb - reserve_mb
    if p is None or p.projected_mb <= room:
        return None
    if p.basis == "declared":
        source = "declared with --mem"
    else:
        runs = f"{p.runs} earlier run{'s' if p.runs != 1 else ''}"
        source = f"projected from {runs}" if p.runs else "an earlier run was killed for memory"
    message = (
        f"needs {gb(p.projected_mb)} of host RAM ({source}), more than the {gb(room)} that "
        f"jobs may use together (host_memory limit {gb(limit_mb)} less the reserve of "
        f"{gb(reserve_mb)}): it will start only when no other job runs"
    )
    data = {"projected_mb": p.projected_mb, "basis": p.basis, "room_mb": room}
    return Event(OVER_LIMIT, message, data)
