"""What a job waits for before it may start: `--after` parents must succeed, `--after-any`
parents must only end. A parent that belongs to an array stands for the whole array: every
index of it (the newest job of each index, so that a restarted index counts, not the run
it replaced), as Slurm's `afterok:<array>` / `afterany:<array>` do. Pure."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import replace

from supervisor.core.jobs import JobSpec, JobState


def parents(spec: JobSpec) -> tuple[int, ...]:
    """Every job this one waits for, each once, `--after` ones first."""
    return tuple(dict.fromkeys((*spec.after, *spec.after_any)))


def must_succeed(spec: JobSpec, parent: int) -> bool:
    """Whether `parent` has to succeed (an `--after` parent), or only end. A parent named
    by both is held to the stricter."""
    return parent in spec.after


def blocks(spec: JobSpec, parent: int, state: JobState) -> bool:
    """Whether the ended parent's end makes the child fail (`dependency_failed`)."""
    return state.terminal and state is not JobState.SUCCEEDED and must_succeed(spec, parent)


SHOWN = 5  # parents named in a waiting_for text; past that, a count and the first few


def waiting_text(pending: frozenset[int]) -> str | None:
    """What a job waiting for its parents shows: "waiting for job 4, 7", or, for a big
    array, "waiting for 812 jobs: 190, 191, 192, ...". Bounded: it is rebuilt at every
    parent's end."""
    if not pending:
        return None
    if len(pending) <= SHOWN:
        return f"waiting for job {', '.join(map(str, sorted(pending)))}"
    first = ", ".join(map(str, heapq.nsmallest(3, pending)))
    return f"waiting for {len(pending)} jobs: {first}, ..."


def newest_per_index(members: Iterable[tuple[int, int | None]]) -> tuple[int, ...]:
    """(job id, array index) of an array's jobs -> the newest job of each index, in index
    order: a restart's job replaces the one it reran."""
    newest: dict[int | None, int] = {}
    for job_id, index in sorted(members):
        newest[index] = job_id
    return tuple(newest[i] for i in sorted(newest, key=lambda i: -1 if i is None else i))


def expand(ids: Iterable[int], arrays: Mapping[int, tuple[int, ...]]) -> tuple[int, ...]:
    """Each id that is a job of an array becomes every index of that array (`arrays` maps
    such an id to the array's jobs); the others stay. Order kept, each id once."""
    out: dict[int, None] = {}
    for i in ids:
        for j in arrays.get(i, (i,)):
            out[j] = None
    return tuple(out)


def expanded(spec: JobSpec, arrays: Mapping[int, tuple[int, ...]]) -> JobSpec:
    """The spec with its parents' arrays spelled out, as it is stored: a restart or a
    daemon restart waits for the same jobs."""
    if not arrays or not (spec.after or spec.after_any):
        return spec
    after = expand(spec.after, arrays)
    after_any = tuple(i for i in expand(spec.after_any, arrays) if i not in after)
    if (after, after_any) == (spec.after, spec.after_any):
        return spec
    return replace(spec, after=after, after_any=after_any)
