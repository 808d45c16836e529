"""gpusv: the command-line client.

Every command pays for what is imported before it runs, so this module imports only the
connection at its top. The plain spellings of `list`, `show`, `submit` and `run` take a
lean path (quick.py) that skips argparse; every other command line goes through the
parser (parser.py), which names the module that runs it, and only that module is
imported.

Exit codes: 0 success, 1 the daemon said no, 2 bad usage, 3 the daemon cannot be reached;
`wait`, `run` and `submit --wait` exit with the job's own status, 124 when `wait` timed
out, 125 when the job ended without a status of its own.
"""

from __future__ import annotations

import os
import sys

from supervisor.client.connection import Client, Refused, Unreachable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: every command starts sooner
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import NoReturn

EXIT_NO = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

__all__ = ["Client", "Refused", "Unreachable", "main"]

# The daemon names request fields; a person typed flags.
FLAGS = {
    "gpus": "--gpus",
    "vram_mb": "--vram",
    "mem_mb": "--mem",
    "mem_key": "--mem-key",
    "mem_scale": "--mem-scale",
    "name": "--name",
    "labels": "--label",
    "retries": "--retries",
    "gpu_hang_retries": "--gpu-hang-retries",
    "progress_timeout_s": "--progress-timeout",
    "progress_regex": "--progress-regex",
    "stall_timeout_s": "--stall-timeout",
    "priority": "--priority",
    "after": "--after",
    "time_limit_s": "--time",
    "cards": "--cards",
    "not_cards": "--not-cards",
    "timeout_s": "--timeout",
    "older_than_s": "--older-than",
    "tail_lines": "--tail",
    "limit": "--limit",
    "states": "--state",
    "argv": "the command",
    "argvs": "--batch",
}


def in_cli_terms(message: str) -> str:
    for field, flag in FLAGS.items():
        message = message.replace(f"field '{field}'", flag)
    return message


def is_usage(exc: Refused) -> bool:
    """The daemon refused a value that was typed as a flag (out of range, too long): bad
    usage, as the parser would have said had it known the bound. Not a field the client
    added itself, nor one this daemon does not know (an older daemon)."""
    text = str(exc)
    return (
        exc.code == "bad_request"
        and not text.startswith("unknown field")
        and in_cli_terms(text) != text
    )


def _sockets(a: argparse.Namespace) -> list[str]:
    """Where to connect. quick.sockets() is locations.client_sockets() without pathlib
    (some 3 ms of every command's start); only --config needs the file's `socket` key."""
    from supervisor.client.quick import sockets

    flag = getattr(a, "socket", None)
    config = getattr(a, "config", None)
    if flag is None and config is not None:
        from pathlib import Path

        from supervisor.wire.locations import config_socket

        flag = config_socket(Path(config))
    return sockets(flag, os.environ, os.geteuid())


def _completion(shell: str) -> int:
    from supervisor.client.completion import script
    from supervisor.client.parser import parser

    sys.stdout.write(script(parser(), shell))
    return 0


def _usage(cmd: str | None, message: str) -> int:
    from supervisor.client.parser import parser
    from supervisor.client.usage import fail

    return fail(parser(), cmd, message)


def _guarded(command: Callable[[], int], cmd: str | None) -> int:
    """Run a command; the errors every command shares become a line on stderr (after the
    command's usage, for a usage error) and an exit code."""
    try:
        return command()
    except Refused as exc:
        if is_usage(exc):
            return _usage(cmd, in_cli_terms(str(exc)))
        sys.stderr.write(f"gpusv: {in_cli_terms(str(exc))} ({exc.code})\n")
        return EXIT_NO
    except Unreachable as exc:
        sys.stderr.write(f"gpusv: {exc}\n")
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        return _usage(cmd, f"{exc.strerror or exc}{where}")
    except ValueError as exc:
        from supervisor.wire.sizes import ConfigError  # a ValueError: looked at only here

        if not isinstance(exc, ConfigError):
            raise
        return _usage(cmd, str(exc))


def _call(a: argparse.Namespace) -> int:
    import importlib

    from supervisor.client.reconnect import connect_timeout

    module, _, name = a.fn.partition(".")
    fn = getattr(importlib.import_module(f"supervisor.client.{module}"), name)
    client = Client(_sockets(a), connect_timeout(a.connect_timeout, os.environ))
    if a.cmd == "health":  # its answer is bounded as a whole, the wait for a restart too
        from supervisor.wire.durations import parse_duration

        client.answer_timeout = parse_duration(a.timeout, "--timeout")
    code: int = fn(client, a)
    return code


def _run(args_list: list[str]) -> int:
    from supervisor.client import quick

    lean = quick.parse(args_list)
    if lean is not None:
        try:
            return _guarded(lambda: quick.run(lean), lean.cmd)
        except quick.NoAnswer:
            pass  # the full path tries again and says what it tried
    from supervisor.client.parser import parser

    a = parser().parse_args(args_list)
    if a.cmd == "completion":
        return _completion(a.shell)
    return _guarded(lambda: _call(a), a.cmd)


def _quiet_stdout() -> None:
    """The reader went away (`| head -1`): it had what it wanted. Point stdout at
    /dev/null so that the flush at exit does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> NoReturn:
    """The program: given no argv (the console script, `python -m`), it ends the process
    with os._exit once everything is flushed; given argv, with sys.exit."""
    args_list = sys.argv[1:] if argv is None else argv
    try:
        if args_list[:1] == ["classify-kernel-log"]:  # local, no daemon: no socket set-up
            from supervisor.faults.classify_cli import main as classify

            code = classify(args_list[1:])
        else:
            code = _run(args_list)
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        code = 0
    if argv is None:
        # The interpreter's teardown frees every module and object one by one: about 3 ms
        # of a 30 ms `gpusv list` here. Nothing is left for it to do: output is flushed,
        # the kernel closes the socket, the client starts no thread and sets no atexit.
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
