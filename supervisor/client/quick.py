"""`gpusv list`, `show`, `submit` and `run` without argparse: the commands typed most
often start with the connection, json and their own module only (argparse, and building
the parser of every command, are some 9 ms of a start).

parse() understands only the plain spellings of these commands' options and makes of them
what the parser would (tests/client/test_quick.py holds them to that, and the option
tables to the parser's); anything else (help, abbreviations, --config, a value that
starts with '-' other than '-' itself, a number int() refuses, a command not after `--`)
returns None and goes to the parser. When no socket answers, run() raises NoAnswer and the
full path tries again, so that the message about what was tried is the usual one (a
`--batch` source is read once: submitting.py keeps its text for that second try)."""

from __future__ import annotations

import errno
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import SimpleNamespace
    from typing import Any
else:
    # types.SimpleNamespace is the class of sys.implementation: the same class, without
    # importing `types` (a third of a millisecond of every lean command's start).
    SimpleNamespace = type(sys.implementation)

# The parser's defaults (parser.py), option -> (attribute, takes a value, converter).
_GLOBAL = {"version": None, "socket": None, "config": None, "connect_timeout": None}
_LIST_DEFAULTS = {
    "state": None,
    "user": None,
    "mine": False,
    "all": False,
    "limit": 1000,
    "name": None,
    "label": None,
}
_LIST_OPTIONS: dict[str, tuple[str, bool, Any]] = {
    "--state": ("state", True, str),
    "--user": ("user", True, str),
    "--mine": ("mine", False, None),
    "--all": ("all", False, None),
    "--limit": ("limit", True, int),
    "--array": ("array", True, int),
    "--name": ("name", True, str),
    "--label": ("label", True, list),  # repeatable: each one appended
    "--json": ("json", False, None),
}
_SHOW_OPTIONS: dict[str, tuple[str, bool, Any]] = {"--json": ("json", False, None)}
APPEND = list  # the converter of a repeatable option: each value is appended (_options)
# parser.add_job_options: what `submit` and `run` share, and its defaults.
JOB_OPTIONS: dict[str, tuple[str, bool, Any]] = {
    "--gpus": ("gpus", True, int),
    "--vram": ("vram", True, str),
    "--mem": ("mem", True, str),
    "--mem-key": ("mem_key", True, str),
    "--mem-scale": ("mem_scale", True, float),
    "--name": ("name", True, str),
    "--label": ("label", True, APPEND),
    "--retries": ("retries", True, int),
    "--gpu-hang-retries": ("gpu_hang_retries", True, int),
    "--progress-timeout": ("progress_timeout", True, str),
    "--progress-regex": ("progress_regex", True, str),
    "--stall-timeout": ("stall_timeout", True, str),
    "--priority": ("priority", True, int),
    "--after": ("after", True, APPEND),
    "--after-any": ("after_any", True, APPEND),
    "--share": ("share", False, None),
    "--time": ("time", True, str),
    "--cards": ("cards", True, str),
    "--not-cards": ("not_cards", True, str),
}
_JOB_DEFAULTS = {"gpus": 1, "name": "", "priority": 0, "share": False}  # the rest: None
SUBMIT_OPTIONS: dict[str, tuple[str, bool, Any]] = {
    **JOB_OPTIONS,
    "--dry-run": ("dry_run", False, None),
    "--request-id": ("request_id", True, str),
    "--array": ("array", True, str),
    "--max-running": ("max_running", True, int),
    "--wait": ("wait", False, None),
    "--json": ("json", False, None),
    "--batch": ("batch", True, str),
}
_SUBMIT_DEFAULTS = {"dry_run": False, "wait": False, "json": False}
_COMMANDS = {  # the lean commands: their options and the function the parser names
    "list": (_LIST_OPTIONS, "commands.cmd_list"),
    "show": (_SHOW_OPTIONS, "commands.cmd_show"),
    "submit": (SUBMIT_OPTIONS, "commands.cmd_submit"),
    "run": (JOB_OPTIONS, "run.cmd_run"),
}
# Path.exists() says "absent" for these and raises for the others; so does _exists().
_ABSENT_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)
SYSTEM_SOCKET = "/run/gpusvd/gpusvd.sock"  # locations.SYSTEM_SOCKET, without pathlib


class NoAnswer(Exception):
    """No socket answered; nothing was sent."""


def _value(args: list[str], i: int, option: str) -> tuple[str, int] | None:
    """The value of `option` at args[i] (`--x V` or `--x=V`) and the index after it."""
    if args[i] == option:
        if i + 1 < len(args) and (args[i + 1] == "-" or not args[i + 1].startswith("-")):
            return args[i + 1], i + 2  # "-" alone is a value to the parser too (stdin)
        return None
    if args[i].startswith(option + "="):
        return args[i][len(option) + 1 :], i + 1
    return None


def _options(
    args: list[str], i: int, options: dict[str, tuple[str, bool, Any]], out: dict[str, Any]
) -> list[str] | None:
    """Read args[i:] into `out`; the positionals left, or None when something is not
    understood here."""
    positionals: list[str] = []
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            positionals.append(arg)
            i += 1
            continue
        name = arg.partition("=")[0]
        if name not in options:
            return None
        attr, takes_value, convert = options[name]
        if not takes_value:
            if arg != name:
                return None
            out[attr], i = True, i + 1
            continue
        got = _value(args, i, name)
        if got is None:
            return None
        try:
            out[attr] = [*(out[attr] or []), got[0]] if convert is list else convert(got[0])
        except ValueError:
            return None
        i = got[1]
    return positionals


def parse(args: list[str]) -> SimpleNamespace | None:
    """What the parser makes of `gpusv [--socket PATH] list|show|submit|run ...`, or None."""
    out: dict[str, Any] = dict(_GLOBAL)
    i = 0
    while i < len(args) and args[i].startswith("--socket"):
        got = _value(args, i, "--socket")
        if got is None:
            return None
        out["socket"], i = got
    if i >= len(args) or args[i] not in _COMMANDS:
        return None
    cmd = out["cmd"] = args[i]
    options, out["fn"] = _COMMANDS[cmd]
    if cmd == "list":
        out.update(_LIST_DEFAULTS, array=None, json=False)
        return SimpleNamespace(**out) if _options(args, i + 1, options, out) == [] else None
    if cmd == "show":
        out.update(json=False)
        ids = _options(args, i + 1, options, out)
        if ids is None or len(ids) != 1:
            return None
        try:
            out["id"] = int(ids[0])
        except ValueError:
            return None
        return SimpleNamespace(**out)
    # submit and run: the command follows `--`, which the parser keeps as its first word
    rest = args[i + 1 :]
    end = rest.index("--") if "--" in rest else len(rest)
    out.update(dict.fromkeys(attr for attr, _, _ in options.values()), **_JOB_DEFAULTS)
    if cmd == "submit":
        out.update(_SUBMIT_DEFAULTS)
    out["label"] = []  # --label appends to the parser's default, an empty list
    if _options(rest[:end], 0, options, out) != []:
        return None
    out["command"] = rest[end:]
    return SimpleNamespace(**out)


def _exists(path: str) -> bool:
    """Path(path).exists() or Path(path).is_symlink(), errors and all."""
    for stat in (os.stat, os.lstat):
        try:
            stat(path)
            return True
        except OSError as exc:
            if exc.errno not in _ABSENT_ERRNOS:
                raise
    return False


def sockets(flag: str | None, env: Mapping[str, str], uid: int) -> list[str]:
    """locations.client_sockets() without pathlib: the same sockets in the same order."""
    for candidate in (flag, env.get("GPUSV_SOCKET")):
        if candidate:
            return [os.path.join(os.getcwd(), os.path.expanduser(candidate))]
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        own = os.path.join(runtime, "gpusvd.sock")
    else:
        own = f"/tmp/gpusvd-{uid}/gpusvd.sock"
    return [own, SYSTEM_SOCKET] if _exists(own) else [SYSTEM_SOCKET]


def run(lean: SimpleNamespace) -> int:
    from supervisor.client import commands
    from supervisor.client.connection import Client, Unreachable

    a: Any = lean  # what the parser would have made: each command reads it as its own
    client = Client(sockets(a.socket, os.environ, os.geteuid()), connect_timeout=None)
    try:
        if a.cmd == "run":
            from supervisor.client.run import cmd_run

            return cmd_run(client, a)
        function = {"list": commands.cmd_list, "show": commands.cmd_show}
        return function.get(a.cmd, commands.cmd_submit)(client, a)
    except Unreachable as exc:
        if exc.maybe_sent or exc.waited:  # it went as far as the full path would
            raise
        raise NoAnswer from None
