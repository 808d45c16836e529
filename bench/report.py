"""The targets as pass/fail lines, and the table that a run prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Results = dict[str, Any]


@dataclass(frozen=True)
class Target:
    name: str
    ok: bool | None  # None: not measured in this run
    detail: str

    def line(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]
        return f"{verdict}  {self.name}: {self.detail}"


def _get(results: Results, *path: str | int) -> Any:
    value: Any = results
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _throughput(r: Results) -> Target:
    name = "throughput >= 500 jobs/s on trivial jobs, and >= Task Spooler's"
    ours = _get(r, "throughput_gpu", "jobs_per_s")
    if ours is None:
        return Target(name, None, "not measured")
    theirs = _get(r, "tsp", "jobs_per_s")
    vs = f", tsp {theirs} jobs/s (ratio {ours / theirs:.2f})" if theirs else ", tsp not run"
    ok = ours >= 500 and (theirs is None or ours >= theirs)
    return Target(name, ok, f"{ours} jobs/s on 2 cards{vs}")


def _vs_tsp(key: str, label: str) -> Callable[[Results], Target]:
    """Keepers' target: 1,000 trivial jobs through one `submit --batch` at >= 1.5x Task
    Spooler's jobs/s, measured in the same run."""

    def target(r: Results) -> Target:
        name = f"keepers: jobs/s on {label} >= 1.5x Task Spooler's (same run)"
        ours, theirs = _get(r, key, "jobs_per_s"), _get(r, "tsp", "jobs_per_s")
        if ours is None or theirs is None:
            return Target(name, None, "not measured" if ours is None else "tsp not run")
        detail = f"{ours} vs {theirs} jobs/s (ratio {ours / theirs:.2f})"
        alone = _get(r, "keepers_alone", ALONE[key], "jobs_per_s")
        if alone is not None:  # the same jobs with no daemon in front: the ceiling
            detail += f"; the keepers alone, no daemon: {alone} jobs/s ({alone / theirs:.2f})"
        detail += _cpu_room(r, key, 1.5 * theirs)
        return Target(name, ours >= 1.5 * theirs, detail)

    return target


def _cpu_room(r: Results, key: str, rate: float) -> str:
    """What the machine's cores leave the daemon at `rate` jobs/s: the whole machine's CPU
    a job at that rate, less what the keepers, their driver and the jobs used alone. Even
    with every core busy and no waiting anywhere, a daemon that needs more cannot reach it."""
    cpus = _get(r, "machine", "cpus")
    alone = _get(r, "keepers_alone", ALONE[key], "machine_cpu_ms_per_job")
    daemon = _get(r, key, "daemon_cpu_ms_per_job")
    if not cpus or alone is None or daemon is None:
        return ""
    budget = 1000 * cpus / rate
    return (
        f"; {cpus} cores at {rate:.0f} jobs/s leave the daemon at most {budget - alone:.2f} ms "
        f"CPU a job ({budget:.2f} ms in all, less the keepers' and jobs' own {alone} ms), "
        f"this run's daemon used {daemon} ms"
    )


# What each throughput run's jobs go through: one keeper for all CPU slots, one per card.
ALONE = {"throughput_cpu": "one_keeper", "throughput_gpu": "keeper_per_slot"}


def _daemon_cpu(r: Results) -> Target:
    name = "keepers: daemon CPU <= 1.5 ms per trivial job"
    per_job = {
        label: _get(r, key, "daemon_cpu_ms_per_job")
        for key, label in (("throughput_cpu", "CPU slots"), ("throughput_gpu", "2 cards"))
    }
    seen = {label: v for label, v in per_job.items() if v is not None}
    if not seen:
        return Target(name, None, "not measured")
    detail = ", ".join(f"{v} ms on {label}" for label, v in seen.items())
    return Target(name, max(seen.values()) <= 1.5, detail)


def _socket_latency(r: Results) -> Target:
    name = "keepers: submit -> start p50 <= 5 ms over the raw socket"
    sock = _get(r, "latency", "socket_submit_to_start_ms", "p50")
    if sock is None:
        return Target(name, None, "not measured")
    floor = _get(r, "latency", "job_spawn_floor_ms", "p50")
    return Target(name, sock <= 5, f"{sock} ms (the job's own sh + date run directly: {floor} ms)")


def _idle_rss(r: Results) -> Target:
    name = "keepers: gpusvd RSS fresh and idle <= 40 MiB"
    rss = r.get("idle_rss_mb")
    if rss is None:
        return Target(name, None, "not measured")
    keepers = r.get("keeper_rss_mb") or {}
    each = ", ".join(f"{k} {v} MiB" for k, v in sorted(keepers.items()))
    return Target(name, rss <= 40, f"{rss} MiB" + (f" (keepers: {each})" if each else ""))


def _batch(r: Results) -> Target:
    rate = _get(r, "queue", "cli_batch", "jobs_per_s")
    name = "batch submit >= 2,000 jobs/s"
    if rate is None:
        return Target(name, None, "not measured")
    jobs = _get(r, "queue", "cli_batch", "jobs")
    return Target(name, rate >= 2000, f"{rate} jobs/s (gpusv submit --batch, {jobs} commands)")


def _client(r: Results) -> Target:
    name = "gpusv submit wall <= 2x bare interpreter start-up"
    ours, bare = (
        _get(r, "client", "gpusv_submit", "p50"),
        _get(r, "client", "bare_interpreter", "p50"),
    )
    if ours is None or bare is None:
        return Target(name, None, "not measured")
    return Target(name, ours <= 2 * bare, f"{ours} ms vs {bare} ms ({ours / bare:.2f}x)")


def _list(r: Results) -> Target:
    name = "list: gpusv list wall <= 30 ms against an idle daemon"
    ours = _get(r, "client", "gpusv_list", "p50")
    if ours is None:
        return Target(name, None, "not measured")
    bare = _get(r, "client", "bare_interpreter", "p50")
    installed = _get(r, "client", "installed_list", "p50")
    beside = "" if installed is None else f"; installed, not editable: {installed} ms"
    return Target(name, ours <= 30, f"{ours} ms (bare interpreter {bare} ms{beside})")


def _latency(r: Results) -> Target:
    name = "submit -> start p50 <= 15 ms over the CLI's own start-up"
    over = _get(r, "latency", "over_cli_ms", "p50")
    if over is None:
        return Target(name, None, "not measured")
    sock = _get(r, "latency", "socket_submit_to_start_ms", "p50")
    return Target(name, over <= 15, f"{over} ms (socket request -> start: {sock} ms)")


def _dispatch(r: Results) -> Target:
    name = "per-dispatch cost at the largest queue <= 1.5x that at 100"
    rows = r.get("dispatch") or []
    if len(rows) < 2:
        return Target(name, None, "not measured")
    small, large = rows[0], rows[-1]
    a, b = small["dispatch_ms"]["p50"], large["dispatch_ms"]["p50"]
    detail = f"{b} ms at {large['queued']:,} vs {a} ms at {small['queued']:,} ({b / a:.2f}x)"
    return Target(name, b <= 1.5 * a, detail)


def _history(
    key: str, name: str, check: Callable[[float], bool], unit: str
) -> Callable[..., Target]:
    def target(r: Results) -> Target:
        value = _get(r, "history", *key.split("."))
        jobs = _get(r, "history", "jobs")
        if value is None:
            return Target(name, None, "not measured")
        return Target(name, check(value), f"{value} {unit} with {jobs:,} jobs of history")

    return target


TARGETS: list[Callable[[Results], Target]] = [
    _vs_tsp("throughput_cpu", "CPU slots"),
    _vs_tsp("throughput_gpu", "2 cards"),
    _daemon_cpu,
    _socket_latency,
    _idle_rss,
    _throughput,
    _batch,
    _client,
    _list,
    _latency,
    _dispatch,
    _history("rss_mb", "daemon RSS <= 80 MB with 100,000 jobs of history", lambda v: v <= 80, "MB"),
    _history("idle_cpu_pct", "idle CPU <= 0.1 %", lambda v: v <= 0.1, "%"),
    _history(
        "restart_ready_s.p50", "restart -> READY <= 2 s with 100,000 jobs", lambda v: v <= 2, "s"
    ),
]


def targets(results: Results) -> list[Target]:
    return [check(results) for check in TARGETS]


def _ms(stat: Any) -> str:
    if not isinstance(stat, dict) or "p50" not in stat:
        return "-"
    return f"{stat['p50']:.1f} / {stat['p95']:.1f} ms"


def rows(r: Results) -> list[tuple[str, str]]:
    """(what, figure) pairs for the printed table; p50 / p95 where both exist."""
    out: list[tuple[str, str]] = []
    c = r.get("client") or {}
    for key, label in (
        ("bare_interpreter", "python -I -S -c pass (floor)"),
        ("interpreter_with_site", "python -c pass (with site)"),
        ("gpusv_submit", "gpusv submit"),
        ("gpusv_submit_to_request", "gpusv submit: exec -> request sent"),
        ("gpusv_list", "gpusv list"),
        ("module_submit", "python -m supervisor.client.cli submit"),
        ("module_list", "python -m supervisor.client.cli list"),
        ("installed_interpreter_with_site", "installed: python -c pass (with site)"),
        ("installed_list", "installed: gpusv list"),
        ("installed_submit", "installed: gpusv submit"),
        ("installed_submit_wait", "installed: gpusv submit --wait -- true"),
        ("installed_run", "installed: gpusv run -- true"),
    ):
        if key in c:
            cpu = c[key].get("cpu_p50") if isinstance(c[key], dict) else None
            out.append((label, _ms(c[key]) + ("" if cpu is None else f", CPU {cpu:.1f} ms")))
    if "cli_import_ms" in c:
        out.append(("import supervisor.client.cli", f"{c['cli_import_ms']} ms"))
    lat = r.get("latency") or {}
    for key, label in (
        ("socket_submit_to_start_ms", "submit request -> job start"),
        ("cli_submit_to_start_ms", "gpusv submit exec -> job start"),
        ("over_cli_ms", "gpusv submit taken by the daemon -> job start"),
        ("job_spawn_floor_ms", "the job's own sh + date, run directly"),
    ):
        if key in lat:
            out.append((label, _ms(lat[key])))
    for key, label in (("throughput_gpu", "2 cards"), ("throughput_cpu", "CPU slots")):
        t = r.get(key)
        if t:
            out.append(
                (
                    f"{t['jobs']} x true, {label}",
                    f"{t['jobs_per_s']} jobs/s, daemon {t['daemon_cpu_ms_per_job']} ms CPU/job, "
                    f"machine {t['machine_cpu_s']} s CPU",
                )
            )
    for key, label in (("one_keeper", "one keeper"), ("keeper_per_slot", "a keeper a slot")):
        k = _get(r, "keepers_alone", key)
        if k:
            out.append(
                (
                    f"keepers alone: {k['jobs']} x true, {k['slots']} slots, {label}",
                    f"{k['jobs_per_s']} jobs/s, keeper {k['keeper_cpu_ms_per_job']} ms CPU/job, "
                    f"machine {k['machine_cpu_ms_per_job']} ms CPU/job",
                )
            )
    for mode, h in sorted((r.get("handover") or {}).items()):
        out.append(
            (
                f"{h['jobs']} x sleep {h['run_s']}, starting ahead {mode}",
                f"slot idle {h['idle_per_job_ms']} ms per job ({h['wall_s']} s)",
            )
        )
    t = r.get("tsp") or {}
    if "jobs_per_s" in t:
        out.append(
            (
                f"tsp: {t['jobs']} x true, {t['slots']} slots",
                f"{t['jobs_per_s']} jobs/s, server {t['server_cpu_s']} s CPU, "
                f"machine {t['machine_cpu_s']} s CPU",
            )
        )
    elif "skipped" in t:
        out.append(("tsp", t["skipped"]))
    for d in r.get("dispatch") or []:
        out.append(
            (
                f"dispatch pass, {d['queued']:,} queued",
                f"{_ms(d['dispatch_ms'])}; idle pass {_ms(d['idle_pass_ms'])}",
            )
        )
    out += _scale_rows(r)
    return out


def _scale_rows(r: Results) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    q = r.get("queue") or {}
    if q:
        n = f"{q['queued']:,} queued"
        b = q["cli_batch"]
        out.append((f"gpusv submit --batch, {b['jobs']:,}", f"{b['jobs_per_s']} jobs/s"))
        if "socket_batches" in q:
            out.append(
                ("submit_batch requests of 10,000", f"{q['socket_batches']['jobs_per_s']} jobs/s")
            )
        out.append((f"CPU job dispatch latency, {n}", _ms(q["cpu_dispatch_latency_ms"])))
        out.append((f"gpusv list, {n}", _ms(q["list"]["gpusv_list_ms"])))
        out.append((f"daemon RSS, {n}", f"{q['rss_mb']} MB"))
        out.append((f"restart -> READY, {n}", f"{q['restart_ready_s']} s"))
    h = r.get("history") or {}
    if h:
        n = f"{h['jobs']:,} in history"
        out.append((f"restart -> READY, {n}", f"{h['restart_ready_s']['p50']} s"))
        out.append((f"gpusv list, {n}", _ms(h["list"]["gpusv_list_ms"])))
        out.append((f"daemon RSS, {n}", f"{h['rss_mb']} MB"))
        out.append((f"idle CPU over {h['idle_s']:.0f} s", f"{h['idle_cpu_pct']} %"))
    if "idle_rss_mb" in r:
        out.append(("daemon RSS, fresh and idle", f"{r['idle_rss_mb']} MiB"))
    for name, rss in sorted((r.get("keeper_rss_mb") or {}).items()):
        out.append((f"keeper {name} RSS, after the throughput runs", f"{rss} MiB"))
    s = r.get("sampler") or {}
    if s:
        out.append(("memory sampler, per running job", f"{s['cpu_pct_per_job']} % of a CPU"))
    hang = r.get("hang") or {}
    if hang:
        out.append(("kernel line -> gpu_hang recorded", _ms(hang["line_to_gpu_hang_ms"])))
    return out


def table(results: Results) -> str:
    pairs = rows(results)
    width = max((len(a) for a, _ in pairs), default=10)
    lines = [f"{a:<{width}}  {b}" for a, b in pairs]
    lines += ["", *(t.line() for t in targets(results))]
    return "\n".join(lines)
