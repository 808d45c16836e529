"""gpusv's command line: every command and option, each with one line of help and its unit.

Shell completion (completion.py) is generated from this parser, so it never drifts. Each
command names its function as "module.function": only the module that runs is imported.
"""

from __future__ import annotations

import argparse
import sys

from supervisor.client.usage import Parser

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: commands start sooner
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

RETRY_NOTE = (
    "default: the daemon's [retries] ordinary, 3 unless configured: any non-zero exit "
    "is retried up to that many times; 0 turns retries off"
)


class _Version(argparse.Action):
    """--version, with the version read only when asked (it costs an import)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kw: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("gpusv")
        except PackageNotFoundError:
            text = "unknown"
        sys.stdout.write(f"gpusv {text}\n")
        parser.exit(0)


def _json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON document")


def _ids(p: argparse.ArgumentParser, nargs: str = "+") -> None:
    p.add_argument("ids", type=int, nargs=nargs, metavar="ID", help="job id")


def add_job_options(p: argparse.ArgumentParser) -> None:
    """What `submit` and `run` share: what the job needs and how it is treated."""
    p.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs (0: CPU only; default 1)")
    p.add_argument("--vram", metavar="SIZE", help="VRAM per card, e.g. 20G (K/M/G/T: x1024)")
    p.add_argument("--mem", metavar="SIZE", help="host RAM it needs, e.g. 64G (or history if more)")
    p.add_argument("--mem-key", dest="mem_key", metavar="KEY", help="jobs that share RAM history")
    p.add_argument(
        "--mem-scale", dest="mem_scale", type=float, metavar="X", help="problem size (RAM fit)"
    )
    p.add_argument("--name", default="", help="a name shown by list and show")
    p.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="a label (repeatable)"
    )
    p.add_argument("--retries", type=int, metavar="N", help="retries of failed runs; " + RETRY_NOTE)
    p.add_argument(
        "--gpu-hang-retries",
        dest="gpu_hang_retries",
        type=int,
        metavar="N",
        help="retries after a GPU hang (separate budget, default 20)",
    )
    p.add_argument(
        "--progress-timeout",
        dest="progress_timeout",
        metavar="DURATION",
        help="stop a job silent this long at ~0%% GPU (90, 90s, 15m, 2h; default 30m)",
    )
    p.add_argument(
        "--progress-regex", dest="progress_regex", metavar="REGEX", help="output that is progress"
    )
    p.add_argument(
        "--stall-timeout",
        dest="stall_timeout",
        metavar="DURATION",
        help="stop a job without progress this long at any GPU load (0: off; default: config)",
    )
    p.add_argument("--priority", type=int, default=0, metavar="N", help="higher starts first")
    p.add_argument(
        "--after",
        action="append",
        metavar="ID[,ID]",
        help="start only after these jobs succeeded; an array's id: all of it (repeatable)",
    )
    p.add_argument(
        "--after-any",
        dest="after_any",
        action="append",
        metavar="ID[,ID]",
        help="start only after these jobs ended, however they ended (repeatable)",
    )
    p.add_argument(
        "--share",
        action="store_true",
        help="share one card with other --share jobs while their --vram fits",
    )
    p.add_argument(
        "--time",
        metavar="DURATION",
        help="wall-time limit per run (90, 90s, 15m, 2h, 1d): then stopped, reason timeout",
    )
    p.add_argument("--cards", metavar="LIST", help="run only on these cards, e.g. 0,2-3")
    p.add_argument("--not-cards", dest="not_cards", metavar="LIST", help="never on these cards")


def _add_submit(sub: Any) -> None:
    p = sub.add_parser("submit", help="queue a command", description="Queue a command.")
    add_job_options(p)
    p.add_argument(
        "--dry-run", dest="dry_run", action="store_true", help="validate, create nothing"
    )
    p.add_argument(
        "--request-id",
        dest="request_id",
        metavar="STR",
        help="a repeat with the same id from the same user returns the first job",
    )
    p.add_argument(
        "--array", metavar="RANGE", help="one job per index, e.g. 0-99 or 0-99%%8 (8 at a time)"
    )
    p.add_argument(
        "--max-running", dest="max_running", type=int, metavar="N", help="of an array, N at once"
    )
    p.add_argument("--wait", action="store_true", help="wait for the end; exit as `wait` does")
    _json(p, "the job (a batch: its ids)")
    p.add_argument(
        "--batch", metavar="FILE", help="one command per line (- for stdin), split as a shell does"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG]...")
    p.set_defaults(fn="commands.cmd_submit")
    p = sub.add_parser(
        "run",
        help="submit, stream its output, exit with its status",
        description="Submit a command, stream its stdout and stderr, exit with its status. "
        "Ctrl-C, SIGTERM or a lost connection cancel the job.",
    )
    add_job_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG]...")
    p.set_defaults(fn="run.cmd_run")


def _add_reading(sub: Any) -> None:
    s = sub.add_parser("list", help="jobs: active and recent (24 h) by default")
    s.add_argument("--state", metavar="STATE[,STATE]", help="queued, running, succeeded, ...")
    s.add_argument("--user", metavar="NAME", help="only this user's jobs")
    s.add_argument("--mine", action="store_true", help="only my jobs")
    s.add_argument("--all", action="store_true", help="every job, not only active and recent")
    s.add_argument("--limit", type=int, default=1000, metavar="N", help="at most N jobs (newest)")
    s.add_argument("--array", type=int, metavar="A", help="only the jobs of array A")
    s.add_argument("--name", metavar="GLOB", help="only jobs whose name matches (* ? [...])")
    s.add_argument(
        "--label", action="append", metavar="K=V", help="only jobs with this label (repeatable)"
    )
    _json(s, "the jobs")
    s.set_defaults(fn="commands.cmd_list")
    s = sub.add_parser("show", help="one job in full")
    s.add_argument("id", type=int, metavar="ID", help="job id")
    _json(s, "the job")
    s.set_defaults(fn="commands.cmd_show")
    s = sub.add_parser(
        "logs", help="a job's output and errors, in the order written (all, or the last lines)"
    )
    s.add_argument("id", type=int, metavar="ID", help="job id")
    s.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    s.add_argument("--stdout", action="store_true", help="standard output alone")
    s.add_argument("--stderr", action="store_true", help="standard error alone")
    s.add_argument("--tail", type=int, metavar="N", help="start at the last N lines")
    s.add_argument("--json", action="store_true", help='one {"stream", "line"} object a line')
    s.set_defaults(fn="commands.cmd_logs")
    s = sub.add_parser("wait", help="wait for jobs; exit with the first failure's status")
    _ids(s, "*")
    s.add_argument("--array", type=int, metavar="A", help="all jobs of array A")
    s.add_argument("--timeout", metavar="DURATION", help="give up after (90, 15m, 2h): exit 124")
    _json(s, "the jobs")
    s.set_defaults(fn="commands.cmd_wait")


def _add_actions(sub: Any) -> None:
    s = sub.add_parser("cancel", help="cancel jobs (queued or running)")
    s.add_argument("ids", nargs="*", metavar="ID", help="job ids, ranges (15-20), lists (15,16)")
    s.add_argument("--all", action="store_true", help="all my queued and running jobs")
    s.add_argument("--array", type=int, metavar="A", help="the active jobs of array A")
    _json(s)
    s.set_defaults(fn="commands.cmd_cancel")
    for verb, text in (
        ("restart", "queue a new job with the same spec; prints its id"),
        ("hold", "keep queued jobs from starting"),
        ("release", "let held jobs start again"),
    ):
        s = sub.add_parser(verb, help=text)
        _ids(s, "*" if verb == "restart" else "+")
        _json(s)
        s.set_defaults(fn="commands.cmd_verb", verb=verb)
        if verb == "restart":
            s.add_argument("--array", type=int, metavar="A", help="with --failed: of array A")
            s.add_argument("--failed", action="store_true", help="the array's failed indices")
    s = sub.add_parser("update", help="change queued jobs: priority, time limit, cards")
    _ids(s)
    s.add_argument("--priority", type=int, metavar="N", help="higher starts first")
    s.add_argument("--time", metavar="DURATION", help="wall-time limit per run (90, 15m, 2h)")
    s.add_argument("--cards", metavar="LIST", help="run only on these cards (all: any card)")
    _json(s)
    s.set_defaults(fn="commands.cmd_update")
    for verb, text in (
        ("pause", "start no new job (running ones go on)"),
        ("resume", "start jobs again"),
    ):
        s = sub.add_parser(verb, help=text)
        s.set_defaults(fn="commands.cmd_pause", verb=verb)
    s = sub.add_parser("clean", help="remove my finished jobs and their logs")
    s.add_argument(
        "--older-than", dest="older_than", metavar="DURATION", help="only those ended this long ago"
    )
    _json(s)
    s.set_defaults(fn="commands.cmd_clean")


def _add_operators(sub: Any) -> None:
    for name, fn, text in (
        ("gpus", "commands.cmd_gpus", "the cards: use, VRAM (MiB), health, jobs"),
        ("stats", "commands.cmd_stats", "job counts, failures, GPU hangs, log disk use"),
        ("health", "commands.cmd_health", "problems, if any; exit 0 only when none"),
    ):
        s = sub.add_parser(name, help=text)
        _json(s)
        s.set_defaults(fn=fn)
        if name == "health":
            s.add_argument(
                "--timeout", default="10", metavar="DURATION", help="unanswered by then: exit 3"
            )
    sub.add_parser("metrics", help="Prometheus text").set_defaults(fn="commands.cmd_metrics")
    s = sub.add_parser("top", help="live view: cards, running and held jobs, hangs")
    s.add_argument("--once", action="store_true", help="print one screen and exit")
    s.add_argument("--interval", default="1", metavar="DURATION", help="refresh (default 1s)")
    s.set_defaults(fn="commands.cmd_top")
    sub.add_parser(
        "classify-kernel-log",
        add_help=False,
        help="classify kernel-log lines offline ([FILE|-] [--json] [--faults-only])",
    )
    s = sub.add_parser("completion", help="shell completion script (bash, zsh or fish)")
    s.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell")
    s.set_defaults(fn=None)


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="gpusv",
        description="gpusv: queue and watch jobs on this machine's GPUs.",
        epilog="Exit codes: 0 ok, 1 the daemon said no, 2 bad usage, 3 daemon unreachable; "
        "wait/run: the job's own status, 124 wait timed out, 125 the job has none.",
    )
    p.add_argument("--version", action=_Version)
    p.add_argument("--socket", metavar="PATH", help="gpusvd's socket (default: see docs)")
    p.add_argument("--config", metavar="FILE", help="take the socket from this gpusvd config")
    p.add_argument(
        "--connect-timeout",
        dest="connect_timeout",
        metavar="DURATION",
        help="wait this long for a restarting gpusvd (default $GPUSV_CONNECT_TIMEOUT or 60s)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_submit(sub)
    _add_reading(sub)
    _add_actions(sub)
    _add_operators(sub)
    return p
