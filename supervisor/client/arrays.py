"""Job arrays on the client side: RANGE[%N] parsing, and the verbs that act on an array
as one thing (list, cancel, wait, restart its failed indices)."""

from __future__ import annotations

import sys

from supervisor.wire.sizes import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `list` starts sooner
if TYPE_CHECKING:
    from typing import Any

    from supervisor.client.connection import Client

MAX_INDICES = 100_000
STATE_ORDER = ("queued", "running", "succeeded", "failed", "cancelled")


def parse_range(text: str) -> tuple[list[int], int | None]:
    """ "0-99%8" -> (indices 0..99, cap 8); "1,3,5-9" -> ([1, 3, 5, 6, 7, 8, 9], None)."""
    spec, sep, cap_text = text.partition("%")
    cap = None
    if sep:
        if not cap_text.isdigit():
            raise ConfigError(f"--array {text!r}: the cap after '%' must be a whole number")
        cap = int(cap_text)
        if cap < 1:
            raise ConfigError(f"--array {text!r}: the cap after '%' must be at least 1")
    indices: list[int] = []
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ConfigError(
                f"--array {text!r}: {part.strip()!r} is not an index or a range like 0-99"
            )
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ConfigError(f"--array {text!r}: the range {part.strip()!r} is empty")
        if len(indices) + last - first + 1 > MAX_INDICES:
            raise ConfigError(f"--array {text!r}: more than {MAX_INDICES} indices")
        indices.extend(range(first, last + 1))
    if len(set(indices)) != len(indices):
        raise ConfigError(f"--array {text!r}: an index appears twice")
    return indices, cap


def job_ids(texts: list[str], verb: str) -> list[int]:
    """Job ids as typed: "15", "15-20", "15,16", mixed ("3,7-9 12"), each id once, in order.
    A bad one is a usage error, before anything is sent."""
    ids: dict[int, None] = {}
    for text in texts:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()) or int(lo) < 1:
                raise ConfigError(
                    f"{verb}: {part.strip()!r} is not a job id, a range like 15-20 "
                    "or a list like 15,16"
                )
            first, last = int(lo), int(hi) if dash else int(lo)
            if last < first:
                raise ConfigError(f"{verb}: the range {part.strip()!r} is empty")
            if len(ids) + last - first + 1 > MAX_INDICES:
                raise ConfigError(f"{verb}: more than {MAX_INDICES} jobs at once")
            ids.update(dict.fromkeys(range(first, last + 1)))
    return list(ids)


def array_options(array: str | None, max_running: int | None) -> dict[str, Any]:
    """The submit request's array fields, from --array and --max-running."""
    if max_running is not None and max_running < 1:
        raise ConfigError("--max-running must be at least 1")
    if array is None:
        return {} if max_running is None else {"max_running": max_running}
    indices, cap = parse_range(array)
    if cap is not None and max_running is not None and cap != max_running:
        raise ConfigError("give the cap once: --array RANGE%N or --max-running N")
    cap = cap if cap is not None else max_running
    return {"array": indices, **({"max_running": cap} if cap is not None else {})}


def array_jobs(client: Client, array: int) -> list[dict[str, Any]]:
    """The newest job of each index, in index order: a restart's job replaces the failed one."""
    jobs = client.call({"type": "list", "array": array, "limit": 10_000})["jobs"]
    if not jobs:
        raise ConfigError(f"no array {array}")
    newest: dict[int, dict[str, Any]] = {}
    for job in sorted(jobs, key=lambda j: j["id"]):
        newest[job["array_index"]] = job
    return [newest[i] for i in sorted(newest)]


def summaries(jobs: list[dict[str, Any]]) -> list[str]:
    """One line per array among `jobs`: its newest job per index, counted by state."""
    from collections import Counter  # here: a submit imports this module, and not collections

    by_array: dict[int, dict[int, dict[str, Any]]] = {}
    for job in sorted(jobs, key=lambda j: j["id"]):
        if job.get("array_id") is not None:
            by_array.setdefault(job["array_id"], {})[job["array_index"]] = job
    lines = []
    for array, newest in sorted(by_array.items()):
        counts = Counter(j["state"] for j in newest.values())
        parts = ", ".join(f"{counts[s]} {s}" for s in STATE_ORDER if counts[s])
        lines.append(f"array {array}: {len(newest)} indices: {parts}")
    return lines


def cancel_array(client: Client, array: int) -> int:
    ids = [j["id"] for j in array_jobs(client, array) if j["state"] in ("queued", "running")]
    if ids:
        client.call({"type": "cancel", "ids": ids})
    sys.stdout.write(f"array {array}: {len(ids)} cancelled\n")
    return 0


def restart_failed(client: Client, array: int) -> int:
    ids = client.call({"type": "restart_array", "array": array})["ids"]
    sys.stdout.write("".join(f"{i}\n" for i in ids))
    return 0
