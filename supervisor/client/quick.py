"""`gpusv list` and `gpusv show` without argparse: the commands typed most often start
with the connection, json and the renderer only.

parse() understands only the plain spellings of these two commands' options and makes
of them what the parser would (tests/client/test_client.py holds them to that); anything else
(help, abbreviations, --config, a value that starts with '-', a number int() refuses)
returns None and goes to the parser. When no socket answers, run() raises NoAnswer and
the full path tries again, so that the message about what was tried is the usual one.
"""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

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
# Path.exists() says "absent" for these and raises for the others; so does _exists().
_ABSENT_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)
SYSTEM_SOCKET = "/run/gpusvd/gpusvd.sock"  # locations.SYSTEM_SOCKET, without pathlib


class NoAnswer(Exception):
    """No socket answered; nothing was sent."""


def _value(args: list[str], i: int, option: str) -> tuple[str, int] | None:
    """The value of `option` at args[i] (`--x V` or `--x=V`) and the index after it."""
    if args[i] == option:
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            return args[i + 1], i + 2
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
    """What the parser makes of `gpusv [--socket PATH] list|show ...`, or None."""
    out: dict[str, Any] = dict(_GLOBAL)
    i = 0
    while i < len(args) and args[i].startswith("--socket"):
        got = _value(args, i, "--socket")
        if got is None:
            return None
        out["socket"], i = got
    if i >= len(args) or args[i] not in ("list", "show"):
        return None
    out["cmd"] = args[i]
    if args[i] == "list":
        out.update(_LIST_DEFAULTS, array=None, json=False, fn="commands.cmd_list")
        return SimpleNamespace(**out) if _options(args, i + 1, _LIST_OPTIONS, out) == [] else None
    out.update(json=False, fn="commands.cmd_show")
    ids = _options(args, i + 1, _SHOW_OPTIONS, out)
    if ids is None or len(ids) != 1:
        return None
    try:
        out["id"] = int(ids[0])
    except ValueError:
        return None
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


def run(a: SimpleNamespace) -> int:
    from supervisor.client import commands
    from supervisor.client.connection import Client, Unreachable

    client = Client(sockets(a.socket, os.environ, os.geteuid()), connect_timeout=None)
    try:
        return commands.cmd_list(client, a) if a.cmd == "list" else commands.cmd_show(client, a)
    except Unreachable as exc:
        if exc.maybe_sent or exc.waited:  # it went as far as the full path would
            raise
        raise NoAnswer from None
