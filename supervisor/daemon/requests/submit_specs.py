"""From a submit request to the specs of the jobs it makes: the config's defaults for
what the request left out, and an array's index for each of its jobs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.core.evolve import evolve
from supervisor.core.jobs import JobSpec
from supervisor.daemon.config import RetriesConfig, WatchdogConfig
from supervisor.wire.protocol import Submit, SubmitOptions


def job_specs(
    req: Submit,
    keys: Mapping[tuple[str, ...], str],
    uid: int,
    gid: int,
    retries: RetriesConfig,
    watchdog: WatchdogConfig,
    cards: tuple[int, ...] | None = None,
    start: int = 0,
    stop: int | None = None,
) -> list[JobSpec]:
    """The jobs a submit asks for (those of its commands from `start` to `stop`), the
    config's defaults filled in; `keys` is each command's memory key (programs.Lookups),
    `cards` what its --cards and --not-cards leave it (None: any card)."""
    opts = req.options
    timeout = opts.progress_timeout_s

    # What the jobs share, made once: each job is a copy with its own command, name and
    # index (a frozen spec's __init__ is ~10 us; a copy, ~1).
    common = JobSpec(
        argv=(),
        cwd=opts.cwd,
        env=opts.env,
        owner_uid=uid,
        owner_gid=gid,
        name=opts.name,
        labels=opts.labels,
        gpus=opts.gpus,
        vram_mb=opts.vram_mb,
        mem_mb=opts.mem_mb,
        mem_scale=opts.mem_scale,
        retries=retries.ordinary if opts.retries is None else opts.retries,
        gpu_hang_retries=(
            retries.gpu_hang if opts.gpu_hang_retries is None else opts.gpu_hang_retries
        ),
        progress_timeout_s=watchdog.progress_timeout_s if timeout is None else timeout,
        progress_regex=opts.progress_regex,
        priority=opts.priority,
        after=opts.after,
        after_any=opts.after_any,
        stall_timeout_s=_or(opts.stall_timeout_s, watchdog.stall_timeout_s),
        time_limit_s=opts.time_limit_s,
        share=opts.share,
        cards=cards,
    )
    return [
        evolve(
            common,
            argv=argv,
            name=req.names[i] if req.names else opts.name,
            mem_key=keys[argv],
            **_array_fields(opts, i),
        )
        for i, argv in enumerate(req.argvs[start:stop], start)
    ]


def _or(given: float | None, default: float) -> float | None:
    """A job's own timeout, else the configured default; 0 (off) becomes None."""
    value = default if given is None else given
    return value or None


def _array_fields(opts: SubmitOptions, i: int) -> dict[str, Any]:
    """An array's i-th job carries its index; a batch with a cap is an array of its lines."""
    if opts.array:
        return {"array_index": opts.array[i], "max_running": opts.max_running}
    if opts.max_running is not None:
        return {"array_index": i, "max_running": opts.max_running}
    return {}
