"""gpusv: the command-line client. Imports client, sizes and locations only: it starts fast.

Exit codes: 0 success, 1 the daemon said no, 2 bad usage, 3 the daemon cannot be reached;
`wait` and `submit --wait` exit with the job's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from supervisor.client import arrays
from supervisor.client.cards import allocation_notes, health_text, util_text
from supervisor.client.connection import Client, Refused, Unreachable
from supervisor.wire.locations import resolve_socket
from supervisor.wire.sizes import ConfigError, parse_size_mb

EXIT_NO = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

__all__ = ["Client", "Refused", "Unreachable", "main"]


def _out(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        line = "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        sys.stdout.write(line.rstrip() + "\n")


def _command_of(job: dict[str, Any]) -> str:
    if job.get("name"):
        return str(job["name"])
    argv = job.get("argv")
    return shlex.join(argv)[:60] if argv else "-"


# ---- submit --------------------------------------------------------------------------


def _size(text: str | None, flag: str) -> int | None:
    return None if text is None else parse_size_mb(text, flag)


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--label: expected K=V, got {item!r}")
        labels[key] = value
    return labels


def _batch_commands(source: str) -> list[list[str]]:
    text = sys.stdin.read() if source == "-" else Path(source).read_text()
    commands = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            argv = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ConfigError(f"--batch line {n}: {exc}") from None
        if argv:
            commands.append(argv)
    if not commands:
        raise ConfigError("--batch: no commands")
    return commands


def _submit_request(a: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "gpus": a.gpus,
        "vram_mb": _size(a.vram, "--vram"),
        "mem_mb": _size(a.mem, "--mem"),
        "mem_key": a.mem_key,
        "mem_scale": a.mem_scale,
        "name": a.name,
        "labels": _labels(a.label),
        "retries": a.retries,
        "gpu_hang_retries": a.gpu_hang_retries,
        "progress_timeout_s": a.progress_timeout,
        "progress_regex": a.progress_regex,
        "stall_timeout_s": a.stall_timeout,
        "priority": a.priority,
        "after": [int(x) for x in a.after.split(",") if x] if a.after else None,
        "dry_run": a.dry_run,
        "share": a.share or None,
    }
    request = {k: v for k, v in options.items() if v is not None}
    request.update(arrays.array_options(a.array, a.max_running))
    if a.array is not None and a.batch is not None:
        raise ConfigError("give either --array or --batch, not both")
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if a.batch is not None:
        if command:
            raise ConfigError("give either --batch or a command, not both")
        return {"type": "submit_batch", "argvs": _batch_commands(a.batch), **request}
    if not command:
        raise ConfigError("submit needs a command after --")
    return {"type": "submit", "argv": command, **request}


def cmd_submit(client: Client, a: argparse.Namespace) -> int:
    reply = client.call(_submit_request(a))
    if a.dry_run:
        jobs = reply["jobs"]
        _out(jobs[0] if len(jobs) == 1 else jobs)
        return 0
    if a.json and "job" in reply:
        _out(reply["job"])
    else:
        sys.stdout.write("".join(f"{i}\n" for i in reply["ids"]))
    sys.stdout.flush()
    if a.wait:
        return _wait(client, reply["ids"], None, quiet=True)
    return 0


# ---- reading -------------------------------------------------------------------------


def cmd_list(client: Client, a: argparse.Namespace) -> int:
    states = [s for s in (a.state or "").split(",") if s]
    request = {"type": "list", "states": states, "limit": a.limit}
    if a.array is not None:
        request["array"] = a.array
    jobs = client.call(request)["jobs"]
    if a.json:
        _out(jobs)
        return 0
    rows = [
        [
            str(j["id"]),
            j["state"],
            ",".join(map(str, j.get("gpus") or [])) or "-",
            _command_of(j),
            j.get("waiting_for") or j.get("progress") or "",
        ]
        for j in jobs
    ]
    _table(rows, ["ID", "STATE", "GPUS", "COMMAND", "NOTE"])
    sys.stdout.write("".join(f"{line}\n" for line in arrays.summaries(jobs)))
    return 0


def cmd_show(client: Client, a: argparse.Namespace) -> int:
    job = client.call({"type": "show", "ids": [a.id]})["job"]
    if a.json:
        _out(job)
        return 0
    for key in ("id", "name", "state", "reason", "exit_code", "waiting_for", "progress"):
        sys.stdout.write(f"{key:14} {job.get(key)}\n")
    sys.stdout.write(f"{'command':14} {shlex.join(job['argv'])}\n")
    sys.stdout.write(f"{'gpus':14} {job['gpus']} (requested {job['gpus_requested']})\n")
    sys.stdout.write(f"{'host_memory':14} {job['host_memory']}\n")
    r = job["retries"]
    sys.stdout.write(
        f"{'retries':14} ordinary {r['ordinary']['used']}/{r['ordinary']['budget']}, "
        f"gpu_hang {r['gpu_hang']['used']}/{r['gpu_hang']['budget']}\n"
    )
    for at in job.get("attempts", []):
        sys.stdout.write(
            f"  attempt {at['n']}: gpus={at['gpus']} pid={at['pid']} reason={at['reason']} "
            f"exit={at['exit_code']} signal={at['signal']} peak_rss_mb={at['peak_rss_mb']}\n"
        )
    for ev in job.get("events", []):
        sys.stdout.write(f"  {ev['at']}  {ev['kind']:16} {ev['message']}\n")
    return 0


def cmd_logs(client: Client, a: argparse.Namespace) -> int:
    from base64 import b64decode  # only here: every other command starts without it

    offset = 0
    stream = "stderr" if a.stderr else "stdout"
    out = sys.stdout.buffer
    while True:
        reply = client.call({"type": "logs", "ids": [a.id], "stream": stream, "offset": offset})
        data = b64decode(reply["data_b64"])
        out.write(data)
        out.flush()
        offset = reply["offset"]
        if not a.follow or reply["done"]:
            return 0
        if not data:
            time.sleep(0.2)


def cmd_cancel(client: Client, a: argparse.Namespace) -> int:
    if a.array is not None:
        return arrays.cancel_array(client, a.array)
    if not a.ids:
        raise ConfigError("cancel needs job ids or --array A")
    reply = client.call({"type": "cancel", "ids": a.ids})
    code = 0
    for r in reply["results"]:
        if r["ok"]:
            sys.stdout.write(f"{r['id']} {r['state']}\n")
        else:
            sys.stderr.write(f"gpusv: job {r['id']}: {r['error']}\n")
            code = EXIT_NO
    return code


def _wait(client: Client, ids: list[int], timeout: float | None, quiet: bool = False) -> int:
    request: dict[str, Any] = {"type": "wait", "ids": ids}
    if timeout is not None:
        request["timeout_s"] = timeout
    reply = client.call(request)
    if reply["timed_out"]:
        sys.stderr.write("gpusv: timed out waiting\n")
        return EXIT_NO
    for job in reply["jobs"]:
        if not quiet:
            sys.stdout.write(f"{job['id']} {job['state']} exit_code={job.get('exit_code')}\n")
        if job["state"] != "succeeded":
            code = job.get("exit_code")
            return int(code) if code else EXIT_NO
    return 0


def cmd_wait(client: Client, a: argparse.Namespace) -> int:
    if a.array is not None:
        return _wait(client, [j["id"] for j in arrays.array_jobs(client, a.array)], a.timeout)
    if not a.ids:
        raise ConfigError("wait needs job ids or --array A")
    return _wait(client, a.ids, a.timeout)


def cmd_restart(client: Client, a: argparse.Namespace) -> int:
    if a.array is None or not a.failed:
        raise ConfigError("restart takes --array A --failed")
    return arrays.restart_failed(client, a.array)


def cmd_gpus(client: Client, a: argparse.Namespace) -> int:
    gpus = client.call({"type": "gpus"})["gpus"]
    if a.json:
        _out(gpus)
        return 0
    rows = [
        [
            str(g["index"]),
            g["pci_bus_id"] or "?",
            g["name"],
            util_text(g.get("utilization_pct")),
            f"{g['vram_used_mb']}/{g['vram_total_mb']} MiB",
            health_text(g),
            ",".join(map(str, g["running_jobs"])) or "-",
            str(g["gpu_hangs"]),
        ]
        for g in gpus
    ]
    _table(rows, ["GPU", "BUS ID", "NAME", "UTIL", "VRAM", "HEALTH", "JOBS", "HANGS"])
    for note in allocation_notes(gpus):
        print(note)
    return 0


def cmd_stats(client: Client, a: argparse.Namespace) -> int:
    reply = client.call({"type": "stats"})
    reply.pop("ok", None)
    if a.json:
        _out(reply)
        return 0
    sys.stdout.write("jobs:     " + _pairs(reply["jobs"]) + "\n")
    sys.stdout.write("failures: " + (_pairs(reply["failures"]) or "none") + "\n")
    sys.stdout.write(f"gpu hangs: {len(reply['gpu_hangs'])}\n")
    for h in reply["gpu_hangs"][-20:]:
        sys.stdout.write(
            f"  {h['at']}  job {h['job']} attempt {h['attempt']} gpu {h['gpu']} "
            f"({h['pci_bus_id']}, driver {h['driver_version']}) labels={h['labels']}\n"
        )
    return 0


def _pairs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items()))


def cmd_health(client: Client, a: argparse.Namespace) -> int:
    health = client.call({"type": "health"})["health"]
    if a.json:
        _out(health)
    elif health["ok"]:
        sys.stdout.write("ok\n")
    else:
        sys.stdout.write("".join(f"{p}\n" for p in health["problems"]))
    return 0 if health["ok"] else EXIT_NO


def cmd_metrics(client: Client, a: argparse.Namespace) -> int:
    sys.stdout.write(client.call({"type": "metrics"})["text"])
    return 0


def cmd_top(client: Client, a: argparse.Namespace) -> int:
    from supervisor.client.top import run  # the terminal code loads only for this command

    return run(lambda: client.call({"type": "top"}), once=a.once, interval=a.interval)


# ---- parsing -------------------------------------------------------------------------


def _add_submit(sub: Any) -> None:
    p = sub.add_parser("submit", help="submit a command")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--vram")
    p.add_argument("--share", action="store_true")
    p.add_argument("--array")
    p.add_argument("--max-running", dest="max_running", type=int)
    p.add_argument("--mem")
    p.add_argument("--mem-key", dest="mem_key")
    p.add_argument("--mem-scale", dest="mem_scale", type=float)
    p.add_argument("--name", default="")
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--retries", type=int)
    p.add_argument("--gpu-hang-retries", dest="gpu_hang_retries", type=int)
    p.add_argument("--progress-timeout", dest="progress_timeout", type=float)
    p.add_argument("--progress-regex", dest="progress_regex")
    p.add_argument("--stall-timeout", dest="stall_timeout", type=float)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--after")
    p.add_argument("--dry-run", dest="dry_run", action="store_true")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--batch")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_submit)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpusv", description="gpusv job supervisor client")
    p.add_argument("--socket")
    p.add_argument("--config", type=Path)
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_submit(sub)
    s = sub.add_parser("list")
    s.add_argument("--state")
    s.add_argument("--limit", type=int, default=1000)
    s.add_argument("--array", type=int)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_list)
    s = sub.add_parser("show")
    s.add_argument("id", type=int)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_show)
    s = sub.add_parser("logs")
    s.add_argument("id", type=int)
    s.add_argument("--follow", "-f", action="store_true")
    s.add_argument("--stderr", action="store_true")
    s.set_defaults(fn=cmd_logs)
    s = sub.add_parser("cancel")
    s.add_argument("ids", type=int, nargs="*")
    s.add_argument("--array", type=int)
    s.set_defaults(fn=cmd_cancel)
    s = sub.add_parser("wait")
    s.add_argument("ids", type=int, nargs="*")
    s.add_argument("--timeout", type=float)
    s.add_argument("--array", type=int)
    s.set_defaults(fn=cmd_wait)
    s = sub.add_parser("restart")
    s.add_argument("--array", type=int)
    s.add_argument("--failed", action="store_true")
    s.set_defaults(fn=cmd_restart)
    for name, fn in (("gpus", cmd_gpus), ("stats", cmd_stats), ("health", cmd_health)):
        s = sub.add_parser(name)
        s.add_argument("--json", action="store_true")
        s.set_defaults(fn=fn)
    sub.add_parser("metrics").set_defaults(fn=cmd_metrics)
    s = sub.add_parser("top")
    s.add_argument("--once", action="store_true")
    s.add_argument("--interval", type=float, default=1.0)
    s.set_defaults(fn=cmd_top)
    s = sub.add_parser("classify-kernel-log", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> NoReturn:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["classify-kernel-log"]:  # local, no daemon: skip the socket set-up
        from supervisor.faults.classify_cli import main as classify

        sys.exit(classify(args_list[1:]))
    a = parser().parse_args(args_list)
    try:
        cfg_socket = None
        if a.config is not None:
            from supervisor.daemon.config import (
                load,  # only then: the full config costs start-up time
            )

            cfg_socket = str(load(a.config, uid=os.geteuid()).socket)
        path = resolve_socket(a.socket, os.environ, cfg_socket, os.geteuid())
        client = Client(path)
        code = a.fn(client, a)
    except ConfigError as exc:
        sys.stderr.write(f"gpusv: {exc}\n")
        code = EXIT_USAGE
    except Refused as exc:
        sys.stderr.write(f"gpusv: {exc} ({exc.code})\n")
        code = EXIT_NO
    except Unreachable as exc:
        sys.stderr.write(f"gpusv: {exc}\n")
        code = EXIT_UNREACHABLE
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"gpusv: {exc}\n")
        code = EXIT_USAGE
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
