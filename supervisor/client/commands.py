"""The daemon-backed commands: each takes the connection and the parsed arguments and
returns the exit code. Data goes to stdout (with --json: one JSON document), errors to
stderr."""

from __future__ import annotations

import os
import sys
import time

from supervisor.wire.durations import parse_duration
from supervisor.wire.sizes import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `list` starts sooner
if TYPE_CHECKING:
    import argparse
    from types import SimpleNamespace
    from typing import Any

    from supervisor.client.connection import Client

    Args = argparse.Namespace | SimpleNamespace  # the parser's, or the lean path's (quick.py)

EXIT_NO = 1


def out_json(obj: Any) -> None:
    import json  # here: json imports re, which a command without --json does without

    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _lines(lines: list[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))


SUBMIT_RETRY_S = 30.0  # a lost submit is sent again this long (a daemon restart's span)
SUBMIT_RETRY_PAUSE_S = 0.2


def submit_call(client: Client, request: dict[str, Any]) -> dict[str, Any]:
    """Send a submit; when the connection is lost after it was sent (a daemon restart),
    send it again, with the same request id, until the daemon answers: a repeat is
    answered with the jobs the first made, never with new ones."""
    from supervisor.client.connection import Unreachable

    deadline, sent = time.monotonic() + SUBMIT_RETRY_S, False
    while True:
        try:
            reply = dict(client.call(request))
            for line in reply.get("warnings") or ():  # the job is queued all the same
                sys.stderr.write(f"gpusv: warning: {line}\n")
            return reply
        except Unreachable as exc:
            sent = sent or exc.maybe_sent
            if not sent or "request_id" not in request or exc.waited:
                raise  # exc.waited: the client's own wait for a restart has run out
            if time.monotonic() > deadline:
                raise Unreachable(
                    f"{exc}; the submit may have been recorded: repeat it with "
                    f"--request-id {request['request_id']} to be sure of one job",
                    maybe_sent=True,
                ) from None
            client.reset()
            time.sleep(SUBMIT_RETRY_PAUSE_S)


def cmd_submit(client: Client, a: argparse.Namespace) -> int:
    from supervisor.client.submitting import submit_request

    request = submit_request(a)
    reply = submit_call(client, request)
    if a.dry_run:
        jobs = reply["jobs"]
        out_json(jobs if request["type"] == "submit_batch" else jobs[0])
        return 0
    if "array" in request:  # named by its first job: one id for list/cancel/wait --array
        array = {"id": reply["ids"][0], "ids": reply["ids"], "indices": request["array"]}
        if a.json:
            out_json(array)
        else:
            sys.stdout.write(f"{array['id']}\n")
    elif a.json:
        out_json(reply["job"] if request["type"] == "submit" else {"ids": reply["ids"]})
    else:
        sys.stdout.write("".join(f"{i}\n" for i in reply["ids"]))
    sys.stdout.flush()
    if a.wait:
        return wait_jobs(client, reply["ids"], None, quiet=True)
    return 0


# ---- reading -------------------------------------------------------------------------


def cmd_list(client: Client, a: Args) -> int:
    from supervisor.client import render  # only for the commands that print jobs or sizes
    from supervisor.client.listing import list_request

    reply = client.call(list_request(a))
    jobs = reply["jobs"]
    if a.json:
        out_json(jobs)
    else:
        _lines(render.list_lines(jobs, paused=bool(reply.get("paused"))))
        if any(j.get("array_id") is not None for j in jobs):
            from supervisor.client import arrays  # a module less to import for most lists

            _lines(arrays.summaries(jobs))
    return 0


def cmd_show(client: Client, a: Args) -> int:
    from supervisor.client import render  # only for the commands that print jobs or sizes

    reply = client.call({"type": "show", "ids": [a.id]})
    job = reply["job"]
    if a.json:
        out_json(job)
    else:
        _lines(render.show_lines(job, paused=bool(reply.get("paused"))))
    return 0


def cmd_logs(client: Client, a: argparse.Namespace) -> int:
    from base64 import b64decode  # only here: every other command starts without it

    from supervisor.client import logview

    if a.tail is not None and a.tail < 0:
        raise ConfigError("--tail: must be 0 or more lines")
    if a.stdout and a.stderr:
        raise ConfigError("give --stdout or --stderr, not both")
    stream = "stderr" if a.stderr else "stdout" if a.stdout else "both"
    request: dict[str, Any] = {"type": "logs", "ids": [a.id], "offset": 0, "stream": stream}
    if a.tail is not None:
        request["tail_lines"] = a.tail
    mark = logview.marking(sys.stdout.isatty(), dict(os.environ)) if stream == "both" else "none"
    view = logview.View(sys.stdout.buffer, as_json=a.json, mark=mark)
    while True:
        reply = client.call(dict(request))
        for segment in reply.get("segments", ()):
            view.write(segment["stream"], b64decode(segment["data_b64"]))
        view.write(stream, b64decode(reply["data_b64"]))
        request["offset"] = reply["offset"]
        request.pop("tail_lines", None)
        caught_up = reply["offset"] >= reply.get("size", 0)
        if reply["done"] or (caught_up and not a.follow):
            view.close()
            return 0
        if caught_up:
            time.sleep(0.2)


def wait_jobs(
    client: Client, ids: list[int], timeout: float | None, quiet: bool = False, js: bool = False
) -> int:
    from supervisor.client.submitting import EXIT_WAIT_TIMEOUT, exit_status

    request: dict[str, Any] = {"type": "wait", "ids": ids}
    if timeout is not None:
        request["timeout_s"] = timeout
    reply = client.call(request)
    why = _spawn_failures(client, reply["jobs"])
    if js:
        out_json({"jobs": reply["jobs"], "timed_out": reply["timed_out"]})
    elif not quiet:
        for job in reply["jobs"]:
            reason = why.get(job["id"]) or job.get("reason")
            reason = f" ({reason})" if reason else ""
            sys.stdout.write(f"{job['id']} {job['state']}{reason} exit {exit_status(job)}\n")
    else:  # `submit --wait`, `run`: their output is the job's, so the reason goes to stderr
        for job_id, text in why.items():
            sys.stderr.write(f"gpusv: job {job_id} could not start: {text}\n")
    if reply["timed_out"]:
        sys.stderr.write("gpusv: wait timed out; the jobs go on\n")
        return EXIT_WAIT_TIMEOUT
    for job in reply["jobs"]:
        if job["state"] != "succeeded":
            return exit_status(job)
    return 0


def _spawn_failures(client: Client, jobs: list[dict[str, Any]]) -> dict[int, str]:
    """Why each job that could not start did not (its `show`: the reason is in its
    events), so that `wait` says it as `show` does."""
    from supervisor.client.render import failure_text

    out = {}
    for job in jobs:
        if str(job.get("reason") or "").startswith("spawn_") and job.get("id") is not None:
            out[job["id"]] = failure_text(client.call({"type": "show", "ids": [job["id"]]})["job"])
    return out


def cmd_wait(client: Client, a: argparse.Namespace) -> int:
    timeout = None if a.timeout is None else parse_duration(a.timeout, "--timeout")
    ids = a.ids
    if a.array is not None:
        from supervisor.client import arrays

        ids = [j["id"] for j in arrays.array_jobs(client, a.array)]
    if not ids:
        raise ConfigError("wait needs job ids or --array A")
    return wait_jobs(client, ids, timeout, js=a.json)


# ---- acting on jobs ------------------------------------------------------------------


def _results(reply: dict[str, Any], a: argparse.Namespace, ok_text: str) -> int:
    results = reply["results"]
    if a.json:
        out_json(results)
    code = 0
    for r in results:
        if not r["ok"]:
            sys.stderr.write(f"gpusv: job {r['id']}: {r['error']}\n")
            code = EXIT_NO
        elif not a.json:
            sys.stdout.write(ok_text.format(**r) + "\n")
    return code


def cmd_cancel(client: Client, a: argparse.Namespace) -> int:
    if a.array is not None:
        from supervisor.client import arrays

        return arrays.cancel_array(client, a.array)
    if bool(a.ids) == a.all:
        raise ConfigError("cancel needs job ids or --all (not both)")
    from supervisor.client.arrays import job_ids

    request: dict[str, Any] = {"type": "cancel", "ids": job_ids(a.ids, "cancel")}
    if a.all:
        request = {"type": "cancel", "all": True}
    return _results(client.call(request), a, "{id} {state}")


def cmd_verb(client: Client, a: argparse.Namespace) -> int:
    """restart, hold and release: per-job results, like cancel."""
    if a.verb == "restart" and (a.array is not None or a.failed):
        if a.array is None or not a.failed or a.ids:
            raise ConfigError("restart takes job ids, or --array A --failed")
        from supervisor.client import arrays

        return arrays.restart_failed(client, a.array)
    if not a.ids:
        raise ConfigError(f"{a.verb} needs job ids")
    text = {"restart": "{new_id}", "hold": "{id} held", "release": "{id} released"}[a.verb]
    return _results(client.call({"type": a.verb, "ids": a.ids}), a, text)


def cmd_update(client: Client, a: argparse.Namespace) -> int:
    """New priority, time limit or cards for queued jobs: per-job results, like hold."""
    from supervisor.client.submitting import parse_cards

    request: dict[str, Any] = {"type": "update", "ids": a.ids}
    if a.priority is not None:
        request["priority"] = a.priority
    if a.time is not None:
        request["time_limit_s"] = parse_duration(a.time, "--time")
        if request["time_limit_s"] == 0:
            raise ConfigError("--time: must be more than 0")
    if a.cards is not None:
        request["cards"] = [] if a.cards == "all" else parse_cards(a.cards, "--cards")
    if len(request) == 2:
        raise ConfigError("update needs --priority, --time or --cards")
    reply = client.call(request)
    for r in reply["results"]:
        if r["ok"]:
            r["state"] = "updated" if r.pop("updated") else "unchanged"
    return _results(reply, a, "{id} {state}")


def cmd_pause(client: Client, a: argparse.Namespace) -> int:
    reply = client.call({"type": a.verb})
    sys.stdout.write("paused: no new job starts\n" if reply["paused"] else "resumed\n")
    return 0


def cmd_clean(client: Client, a: argparse.Namespace) -> int:
    from supervisor.client import render  # only for the commands that print jobs or sizes

    request: dict[str, Any] = {"type": "clean"}
    if a.older_than is not None:
        request["older_than_s"] = parse_duration(a.older_than, "--older-than")
    reply = client.call(request)
    if a.json:
        out_json({"removed": reply["removed"], "freed_mb": reply["freed_mb"]})
    else:
        freed = render.size_text(reply["freed_mb"])
        sys.stdout.write(f"removed {len(reply['removed'])} jobs, {freed} of logs\n")
    return 0


# ---- operators -----------------------------------------------------------------------


def cmd_gpus(client: Client, a: argparse.Namespace) -> int:
    from supervisor.client import render  # only for the commands that print jobs or sizes
    from supervisor.client.cards import allocation_notes, health_text, util_text

    gpus = client.call({"type": "gpus"})["gpus"]
    if a.json:
        out_json(gpus)
        return 0
    rows = [
        [
            str(g["index"]),
            g["pci_bus_id"] or "?",
            g["name"],
            util_text(g.get("utilization_pct")),
            f"{render.size_text(g['vram_used_mb'])} / {render.size_text(g['vram_total_mb'])}",
            health_text(g),
            ",".join(map(str, g["running_jobs"])) or "-",
            ",".join(map(str, g.get("pinned_jobs") or [])) or "-",
            str(g["gpu_hangs"]),
        ]
        for g in gpus
    ]
    header = ["GPU", "BUS ID", "NAME", "UTIL", "VRAM", "HEALTH", "JOBS", "PINNED", "HANGS"]
    _lines(render.table(rows, header))
    _lines(allocation_notes(gpus))
    return 0


def cmd_stats(client: Client, a: argparse.Namespace) -> int:
    from supervisor.client import render  # only for the commands that print jobs or sizes

    reply = client.call({"type": "stats"})
    reply.pop("ok", None)
    if a.json:
        out_json(reply)
        return 0
    sys.stdout.write("jobs:      " + _pairs(reply["jobs"]) + "\n")
    sys.stdout.write("failures:  " + (_pairs(reply["failures"]) or "none") + "\n")
    if "logs" in reply:
        sys.stdout.write(f"job logs:  {render.size_text(reply['logs']['disk_mb'])} on disk\n")
    sys.stdout.write(f"gpu hangs: {len(reply['gpu_hangs'])}\n")
    for h in reply["gpu_hangs"][-20:]:
        labels = ", ".join(f"{k}={v}" for k, v in sorted((h.get("labels") or {}).items()))
        sys.stdout.write(
            f"  {h['at']}  job {h['job']} attempt {h['attempt']} gpu {h['gpu']} "
            f"({h['pci_bus_id']}, driver {h['driver_version']}) {labels}\n"
        )
    return 0


def _pairs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items()))


def cmd_health(client: Client, a: argparse.Namespace) -> int:
    health = client.call({"type": "health"})["health"]
    if a.json:
        out_json(health)
    else:
        lines = ["ok"] if health["ok"] else list(health["problems"])
        if health.get("paused"):
            lines.append("queue paused: no new job starts (gpusv resume)")
        _lines(lines)
    return 0 if health["ok"] else EXIT_NO


def cmd_metrics(client: Client, a: argparse.Namespace) -> int:
    sys.stdout.write(client.call({"type": "metrics"})["text"])
    return 0


def cmd_top(client: Client, a: argparse.Namespace) -> int:
    from supervisor.client.top import run  # the terminal code loads only for this command

    interval = parse_duration(a.interval, "--interval")
    return run(lambda: client.call({"type": "top"}), once=a.once, interval=interval)
