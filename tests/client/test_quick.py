"""The lean path of `gpusv list` and `gpusv show` (supervisor/client/quick.py): it reads a
command line as the parser does or leaves it to the parser, finds the sockets that
locations.client_sockets finds, and imports none of the parser's, pathlib's or typing's
modules; run as the installed gpusv script, not `re` either."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import quick
from supervisor.client.parser import parser
from supervisor.wire.locations import client_sockets

WORDS = [
    "list",
    "show",
    "submit",
    "--socket",
    "--socket=/s.sock",
    "--socket=",
    "--sock",
    "/s.sock",
    "rel.sock",
    "--config",
    "--state",
    "--state=running",
    "--state=",
    "running,queued",
    "--user",
    "--user=root",
    "root",
    "--mine",
    "--all",
    "--all=1",
    "--limit",
    "--limit=5",
    "--lim",
    "--array",
    "--array=x",
    "--name",
    "--name=enc-*",
    "--label",
    "--label=kind=enc",
    "kind=enc",
    "--json",
    "--js",
    "--json=yes",
    "7",
    "-1",
    " 12",
    "1_0",
    "x",
    "",
    "-",
    "--",
    "-h",
    "--help",
    "--version",
    "--gpus",
    "--gpus=0",
    "--label",
    "--label=a=b",
    "--after=3",
    "--share",
    "--wait",
    "--mem-scale",
    "1.5",
    "--name",
    "--batch",
    "--dry-run",
    "true",
]


def parsed_by_argparse(args: list[str]) -> dict[str, object] | None:
    """The parser's namespace, or None where it stops with a usage error or help."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(parser().parse_args(args))
        except SystemExit:
            return None


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([[], ["list"], ["show"], ["--socket", "/s.sock", "list"], ["submit"], ["run"]]),
    st.lists(st.sampled_from(WORDS), max_size=6),
)
def test_the_lean_path_reads_a_command_line_as_the_parser_does_or_not_at_all(
    head: list[str], tail: list[str]
) -> None:
    args = head + tail
    lean = quick.parse(args)
    if lean is not None:
        assert vars(lean) == parsed_by_argparse(args)


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["list", "--json"],
        ["--socket", "/s.sock", "list", "--state", "running", "--limit", "5", "--mine"],
        ["--socket=/s.sock", "list", "--state=queued", "--user", "root", "--all", "--array=3"],
        ["list", "--name", "enc-*", "--label", "kind=enc", "--label=codec=av1"],
        ["show", "7"],
        ["--socket", "/s.sock", "show", "--json", "7"],
        ["submit", "--", "true"],
        ["submit", "--gpus", "0", "--wait", "--", "sh", "-c", "echo --gpus"],
        ["submit", "--label", "a=b", "--label=c=d", "--after", "1", "--", "x", "--", "y"],
        ["--socket", "/s.sock", "submit", "--mem", "2G", "--array=0-9%2", "--json", "--", "t"],
        ["run", "--gpus=2", "--name", "train", "--time", "2h", "--", "python", "train.py"],
        ["submit", "--gpus", "0", "--batch", "-"],
        ["submit", "--name=sweep", "--batch=jobs.txt", "--json"],
    ],
)
def test_the_everyday_spellings_take_the_lean_path(args: list[str]) -> None:
    lean = quick.parse(args)
    assert lean is not None and vars(lean) == parsed_by_argparse(args)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["list", "-h"],
        ["list", "--js"],
        ["list", "--limit", "-1"],
        ["list", "--limit", "x"],
        ["--config", "/etc/gpusvd.toml", "list"],
        ["show"],
        ["show", "1", "2"],
        ["show", "x"],
        ["list", "--", "x"],
        ["submit", "true"],
        ["submit", "--batch", "-x"],
        ["submit", "--gp", "0", "--", "true"],
        ["submit", "--priority", "-5", "--", "true"],
        ["run", "--wait", "--", "true"],
    ],
)
def test_what_the_lean_path_does_not_read_goes_to_the_parser(args: list[str]) -> None:
    assert quick.parse(args) is None


@pytest.mark.parametrize(
    ("command", "table"), [("submit", quick.SUBMIT_OPTIONS), ("run", quick.JOB_OPTIONS)]
)
def test_the_lean_option_tables_are_the_parsers(
    command: str, table: dict[str, tuple[str, bool, object]]
) -> None:
    """Every long option of the parser's `submit` and `run`, with its dest, whether it
    takes a value and how the value is read, and no other."""
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    theirs = {}
    for action in sub.choices[command]._actions:  # type: ignore[index]
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                convert = quick.APPEND if type(action).__name__ == "_AppendAction" else action.type
                takes_value = action.nargs != 0
                theirs[option] = (
                    action.dest,
                    takes_value,
                    convert or (str if takes_value else None),
                )
    assert table == theirs


def test_the_lean_path_finds_the_sockets_locations_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    cases: list[tuple[str | None, dict[str, str], int]] = [
        (None, {}, 1000),
        (None, {"XDG_RUNTIME_DIR": str(run)}, 1000),
        (None, {"XDG_RUNTIME_DIR": "relative"}, 1000),
        (None, {"GPUSV_SOCKET": "/x.sock"}, 0),
        (None, {"GPUSV_SOCKET": "rel/x.sock"}, 1000),
        ("~/y.sock", {"GPUSV_SOCKET": "/x.sock"}, 0),
        ("", {"GPUSV_SOCKET": "/x.sock"}, 0),
        ("/y.sock", {}, 0),
    ]

    def same(flag: str | None, env: dict[str, str], uid: int) -> None:
        expected = client_sockets(flag, env, uid)
        assert [Path(p) for p in quick.sockets(flag, env, uid)] == expected

    for flag, env, uid in cases:
        same(flag, env, uid)
    (run / "gpusvd.sock").symlink_to(tmp_path / "nowhere")  # a dangling link counts
    same(None, {"XDG_RUNTIME_DIR": str(run)}, 1000)
    (run / "gpusvd.sock").unlink()
    (run / "gpusvd.sock").touch()
    same(None, {"XDG_RUNTIME_DIR": str(run)}, 1000)


HEAVY = {
    "argparse",
    "typing",
    "pathlib",
    "fractions",
    "importlib.metadata",
    "supervisor.client.parser",
    "supervisor.client.submitting",
}
# What the lean commands do without: `re` (with `enum`, about 5 ms of a start), which json's
# Python modules, shlex, argparse and pip's console-script wrapper would each import; and
# `types` and `math` (a third of a millisecond each).
NO_RE = {"re", "enum", "json", "shlex", "collections", "types", "math"}
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bin" / "gpusv"  # what installing gpusv puts on the PATH
PROBE = f"""
import os, sys
before = set(sys.modules)
end = os._exit  # the CLI ends with it: say first what was imported
os._exit = lambda code: (os.write(2, " ".join(set(sys.modules) - before).encode()), end(code))
sys.argv[0] = {str(SCRIPT)!r}
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {{"__name__": "__main__"}})
"""


def probe(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The gpusv script run with `args`; its stderr names the modules it imported. Without
    site (-S): an editable install's import hook would import `re` before gpusv starts."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSV_SOCKET", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, "-S", "-c", PROBE, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "PYTHONPATH": str(REPO)},
    )


def test_the_gpusv_script_is_installed_rather_than_a_console_script_wrapper() -> None:
    """pip writes a console script's wrapper with `import re`; bin/gpusv is gpusv's own."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["script-files"] == ["bin/gpusv"]
    assert "gpusv" not in project["project"]["scripts"]
    assert SCRIPT.read_text().startswith("#!/usr/bin/env python3\n")
    assert os.access(SCRIPT, os.X_OK)


def test_list_and_show_import_neither_the_parser_nor_typing_nor_pathlib_nor_re(
    tmp_path: Path,
) -> None:
    """A stand-in daemon answers; the modules each command imported are listed at exit."""
    path = tmp_path / "s.sock"
    job = {"id": 3, "state": "running", "owner_uid": 0, "gpus": [], "gpus_requested": 0}
    job["submitted_at"] = "2026-01-01T00:00:00.000Z"
    budgets = {"ordinary": {"used": 0, "budget": 3}, "gpu_hang": {"used": 0, "budget": 20}}
    full = {**job, "argv": ["true"], "retries": budgets}
    answers = [{"ok": True, "jobs": [job]}, {"ok": True, "job": full}]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        thread = threading.Thread(target=_answer, args=(server, answers), daemon=True)
        thread.start()
        for args in (["list"], ["show", "3"]):
            done = probe(["--socket", str(path), *args])
            assert done.returncode == 0, done.stderr
            assert "3" in done.stdout and "running" in done.stdout
            imported = set(done.stderr.split())
            assert "supervisor.client.quick" in imported
            assert not imported & (HEAVY | NO_RE)
        thread.join(30)
    assert not thread.is_alive()


def _answer(
    server: socket.socket,
    answers: list[dict[str, object]],
    requests: list[dict[str, object]] | None = None,
) -> None:
    for answer in answers:
        conn, _addr = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(1 << 16)
            if requests is not None:
                requests.append(json.loads(data))
            conn.sendall(json.dumps(answer).encode() + b"\n")


@pytest.mark.parametrize(
    ("args", "lean"),
    [(["submit", "--", "true"], True), (["submit", "--priority", "-1", "--", "true"], False)],
)
def test_submit_imports_neither_typing_nor_pathlib_and_a_plain_one_no_re(
    tmp_path: Path, args: list[str], lean: bool
) -> None:
    """A plain submit takes the lean path (no argparse); one the parser reads pays for
    argparse, but not for pathlib (the socket search) or typing (the reconnect rules)."""
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        answers = [{"ok": True, "ids": [5]}]
        thread = threading.Thread(target=_answer, args=(server, answers), daemon=True)
        thread.start()
        done = probe(["--socket", str(path), *args])
        thread.join(30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "5\n"
    imported = set(done.stderr.split())
    assert not imported & {"typing", "pathlib"}
    assert ("argparse" not in imported) is lean
    assert (not imported & NO_RE) is lean
    assert ("supervisor.client.reconnect" not in imported) is lean  # read only on a failure


def _converse(server: socket.socket, answers: list[dict[str, object]]) -> None:
    """One connection, one answer to each request on it in turn."""
    conn, _addr = server.accept()
    with conn:
        data = b""
        for answer in answers:
            while b"\n" not in data:
                data += conn.recv(1 << 16)
            _line, _, data = data.partition(b"\n")
            conn.sendall(json.dumps(answer).encode() + b"\n")


def test_run_imports_no_re(tmp_path: Path) -> None:
    """`gpusv run` of a short job: its submit, a wait, a read of each stream and the show
    of its end, on one connection; the output decoded without base64 (which imports re)."""
    path = tmp_path / "s.sock"
    answers: list[dict[str, object]] = [
        {"ok": True, "ids": [5]},
        {"ok": True, "jobs": [], "timed_out": False},
        {"ok": True, "data_b64": "aGkK", "offset": 3, "done": True},  # "hi\n"
        {"ok": True, "data_b64": "", "offset": 0, "done": True},
        {"ok": True, "job": {"id": 5, "state": "failed", "exit_code": 7}},
    ]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        thread = threading.Thread(target=_converse, args=(server, answers), daemon=True)
        thread.start()
        done = probe(["--socket", str(path), "run", "--", "true"])
        thread.join(30)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "hi\n"
    imported = set(done.stderr.split())
    assert "supervisor.client.run" in imported
    assert not imported & (HEAVY - {"supervisor.client.submitting"} | NO_RE | {"base64"})


def test_a_batch_of_plain_lines_takes_the_lean_path_without_re(tmp_path: Path) -> None:
    """`submit --batch` reads its file on the lean path, and lines with nothing to unquote
    are split without shlex (and so without `re`)."""
    path, batch = tmp_path / "s.sock", tmp_path / "jobs.txt"
    batch.write_text("true\n\tsleep  1\n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        requests: list[dict[str, object]] = []
        thread = threading.Thread(
            target=_answer, args=(server, [{"ok": True, "ids": [5, 6]}], requests), daemon=True
        )
        thread.start()
        done = probe(["--socket", str(path), "submit", "--gpus", "0", "--batch", str(batch)])
        thread.join(30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "5\n6\n"
    assert requests[0]["argvs"] == [["true"], ["sleep", "1"]]
    assert requests[0]["names"] == ["jobs.txt:1", "jobs.txt:2"]
    imported = set(done.stderr.split())
    assert "supervisor.client.quick" in imported
    assert not imported & ({"argparse", "typing", "pathlib"} | NO_RE)


def test_a_batch_from_stdin_that_no_daemon_takes_says_so_as_the_parser_path_does(
    tmp_path: Path,
) -> None:
    """The lean path reads stdin, finds no daemon and leaves the submit to the parser's
    path, which must find the same commands (stdin is read once) and say what it tried."""
    nowhere = str(tmp_path / "none.sock")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--socket", nowhere, "submit", "--batch", "-"],
        input="true\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert f"gpusvd is not running: tried {nowhere} (no such socket)" in done.stderr
