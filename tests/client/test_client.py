"""The CLI's pure parts: batch splitting, --after, durations, exit statuses, socket
lookup, help texts, completion scripts; and the job-log helpers."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import parser as cli_parser
from supervisor.client.completion import script
from supervisor.client.render import LIST_HEADER, list_lines, show_lines, size_text
from supervisor.client.submitting import (
    EXIT_NO_STATUS,
    batch_commands,
    comment_start,
    exit_status,
    parse_after,
)
from supervisor.daemon.store import output_files as joblogs
from supervisor.wire.durations import duration_text, parse_duration
from supervisor.wire.locations import SYSTEM_SOCKET, client_sockets, config_path, config_socket
from supervisor.wire.sizes import ConfigError


def shell_words(line: str) -> list[str]:
    """What bash itself makes of the line's words."""
    out = subprocess.run(
        ["bash", "-c", f"for w in {line}\ndo printf '%s\\0' \"$w\"; done"],
        capture_output=True,
        check=True,
    ).stdout
    return [w.decode() for w in out.split(b"\0")[:-1]]


BATCH_LINES = [
    "blender -b scene.blend -o out/frame_#### -f 5",
    "echo 'a # b' \"c#d\" e\\#f  # a comment",
    'python train.py --tag=#1 --msg "it\'s" x#',
    "   # only a comment",
    "echo a#b #c",
    "printf '%s\\n' \"$HOME\" 'it''s'",
]


@pytest.mark.parametrize("line", BATCH_LINES)
def test_batch_lines_split_as_bash_splits_them(line: str) -> None:
    if "$HOME" in line:  # bash would expand it; gpusv passes the words as written
        assert batch_commands(line)[0][1] == ["printf", "%s\\n", "$HOME", "its"]
        return
    expected = shell_words(line)
    if not expected:
        with pytest.raises(ConfigError, match="no commands"):
            batch_commands(line)
        return
    assert batch_commands(line)[0][1] == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab =-\t\r\x0b\x0c\xa0\u2003'\"\\#", max_size=12), max_size=4))
def test_batch_lines_split_as_shlex_splits_them_whatever_they_hold(lines: list[str]) -> None:
    """Lines with nothing to unquote or cut take a path of their own: the same words as
    shlex's, which splits only at spaces, tabs and CRs (not at other Unicode blanks)."""

    def by_shlex(text: str) -> list[tuple[int, list[str]]] | str:
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            cut = comment_start(line)
            try:
                argv = shlex.split(line if cut is None else line[:cut], comments=False)
            except ValueError:
                return f"line {n}"
            if argv:
                out.append((n, argv))
        return out or "no commands"

    text = "\n".join(lines)
    expected = by_shlex(text)
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            batch_commands(text)
    else:
        assert batch_commands(text) == expected


def test_batch_keeps_hashes_in_words_and_numbers_the_lines() -> None:
    text = "# header\n\nrender -o out/frame_#### -f 5\nrender -o 'a b' -f 6 # six\n"
    assert batch_commands(text) == [
        (3, ["render", "-o", "out/frame_####", "-f", "5"]),
        (4, ["render", "-o", "a b", "-f", "6"]),
    ]
    assert comment_start("a 'b # c' # d") == 10
    with pytest.raises(ConfigError, match="line 1"):
        batch_commands("echo 'unclosed")
    with pytest.raises(ConfigError, match="no commands"):
        batch_commands("# nothing\n")


def test_every_after_is_kept() -> None:
    assert parse_after(["1", "2,3", " 4 , 5"]) == [1, 2, 3, 4, 5]
    assert parse_after(None) is None
    with pytest.raises(ConfigError, match="--after: 'x' is not a job id"):
        parse_after(["1,x"])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1.5m", 90), (7, 7)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text, "--time") == seconds


@pytest.mark.parametrize("text", ["", "m", "5 minutes", "-1", "1w", "nan", "99999d"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--time: must be a duration"):
        parse_duration(text, "--time")


def test_duration_and_size_words() -> None:
    assert [duration_text(s) for s in (5, 300, 3900, 90000)] == ["5s", "5m", "1h05m", "1d01h"]
    assert [size_text(m) for m in (None, 512, 1536, 3 << 20)] == [
        "-",
        "512 MiB",
        "1.5 GiB",
        "3.0 TiB",
    ]


@pytest.mark.parametrize(
    ("job", "code"),
    [
        ({"state": "succeeded", "exit_code": 0}, 0),
        ({"state": "failed", "reason": "exit_nonzero", "exit_code": 7}, 7),
        ({"state": "failed", "reason": "signal", "exit_code": 137}, 137),
        ({"state": "failed", "reason": "timeout", "exit_code": 143}, 143),
        ({"state": "cancelled", "reason": "cancelled", "exit_code": 143}, 143),
        ({"state": "cancelled", "reason": "cancelled", "exit_code": None}, EXIT_NO_STATUS),
        ({"state": "failed", "reason": "spawn_failed", "exit_code": None}, EXIT_NO_STATUS),
        ({"state": "failed", "reason": "dependency_failed", "exit_code": None}, EXIT_NO_STATUS),
    ],
)
def test_exit_status_is_the_jobs_own_or_125(job: dict[str, object], code: int) -> None:
    assert exit_status(job) == code


def test_the_client_looks_for_its_own_daemon_then_the_system_one(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    assert client_sockets(None, env, 1000) == [SYSTEM_SOCKET]
    (tmp_path / "gpusvd.sock").touch()
    assert client_sockets(None, env, 1000) == [tmp_path / "gpusvd.sock", SYSTEM_SOCKET]
    assert client_sockets(None, {**env, "GPUSV_SOCKET": "/x.sock"}, 1000) == [Path("/x.sock")]
    assert client_sockets("/y.sock", {**env, "GPUSV_SOCKET": "/x.sock"}, 0) == [Path("/y.sock")]


def test_config_lookup_order(tmp_path: Path) -> None:
    assert config_path("a.toml", {"GPUSVD_CONFIG": "b.toml"}) == Path("a.toml")
    assert config_path(None, {"GPUSVD_CONFIG": "b.toml"}) == Path("b.toml")
    expected = Path("/etc/gpusvd.toml") if Path("/etc/gpusvd.toml").exists() else None
    assert config_path(None, {}) == expected


def _all_parsers(p: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [("gpusv", p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(name, sub) for name, sub in action.choices.items() if sub.add_help]
    return out


def test_every_option_has_a_line_of_help() -> None:
    for name, p in _all_parsers(cli_parser.parser()):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(c.help for c in action._choices_actions)
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    subparsers = cli_parser.parser()._subparsers
    assert subparsers is not None
    commands = subparsers._group_actions[0]
    assert isinstance(commands, argparse._SubParsersAction)
    submit = commands.choices["submit"]
    help_text = submit.format_help()
    assert "retried up to that many times" in help_text and "DURATION" in help_text


def test_completion_scripts_name_every_command_and_option() -> None:
    p = cli_parser.parser()
    bash = script(p, "bash")
    zsh = script(p, "zsh")
    for word in ("submit", "run", "restart", "--older-than", "--faults-only", "--tail"):
        assert word in bash and word in zsh
    checked = subprocess.run(["bash", "-n"], input=bash, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    probe = f"{bash}\nCOMP_WORDS=(gpusv res); COMP_CWORD=1; _gpusv; echo ${{COMPREPLY[@]}}"
    words = subprocess.run(["bash", "-c", probe], text=True, capture_output=True).stdout
    assert words.split() == ["restart", "resume"]
    if shutil.which("zsh"):
        done = subprocess.run(["zsh", "-n"], input=zsh, text=True, capture_output=True)
        assert done.returncode == 0, done.stderr


def test_list_and_show_read_as_words() -> None:
    job = {
        "id": 7,
        "state": "queued",
        "owner_uid": os.getuid(),
        "name": "",
        "argv": ["python", "train.py", "--msg", "two\nlines"],
        "cwd": "/srv/work",
        "labels": {"team": "nlp"},
        "gpus": [],
        "gpus_requested": 2,
        "submitted_at": "2020-01-01T00:00:00.000Z",
        "waiting_for": "waiting for 2 free GPUs",
        "held": False,
        "host_memory": {"projected_mb": 2048, "basis": "observed", "runs": 3, "peak_mb": 1950},
        "mem_key": "python3 train.py --msg#0ad1f0a9",
        "retries": {"ordinary": {"used": 0, "budget": 3}, "gpu_hang": {"used": 0, "budget": 20}},
        "priority": 5,
        "after": [3, 4],
        "time_limit_s": 7200,
        "exit_code": None,
        "reason": None,
    }
    header, row = list_lines([job])
    assert header.split() == LIST_HEADER
    assert row.split()[:2] == ["7", "queued"] and "python train.py --msg 'two lines'" in row
    assert "waiting for 2 free GPUs" in row and "\n" not in row
    text = "\n".join(show_lines(job))
    for expected in ("/srv/work", "team=nlp", "priority     5", "after        3, 4", "2h00m"):
        assert expected in text
    assert "~2.0 GiB (observed: 3 earlier runs peaked at 1.9 GiB)" in text and "retried" in text
    assert "memory key   python3 train.py --msg#0ad1f0a9" in text
    assert "None" not in text and "{" not in text


def test_tail_offset_finds_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "1.out"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100_000)))
    data, _, size = joblogs.read(path, 0, 1 << 20, 3)
    assert data == b"line 99997\nline 99998\nline 99999\n"
    assert joblogs.read(path, 0, 10, 0)[:2] == (b"", size)
    path.write_bytes(b"a\nb")  # no final newline: "b" is the last line
    assert joblogs.read(path, 0, 100, 1)[0] == b"b"
    assert joblogs.read(path, 0, 100, 5)[0] == b"a\nb"


def test_the_cap_keeps_head_and_tail_and_says_what_was_cut(tmp_path: Path) -> None:
    path = tmp_path / "2.out"
    path.write_bytes(b"H" * (1 << 20) + b"M" * (6 << 20) + b"T" * (1 << 20))
    cut = joblogs.cap(path, 2 << 20)
    data = path.read_bytes()
    assert cut > 0 and len(data) <= (2 << 20) + 8192
    assert data.startswith(b"H" * 1000) and data.endswith(b"T" * (1 << 20))
    assert b"bytes of output cut here" in data
    with open(path, "ab") as fh:  # grows again: cut again, one marker with the total
        fh.write(b"U" * (4 << 20))
    joblogs.cap(path, 2 << 20)
    data = path.read_bytes()
    assert data.count(b"bytes of output cut here") == 1 and data.endswith(b"U" * 1000)
    assert joblogs.cap(path, 64 << 20) == 0


def test_retention_deletes_only_old_logs_of_finished_jobs(tmp_path: Path) -> None:
    now = 1_000_000.0
    files = [
        (tmp_path / "1.out", now - 100),
        (tmp_path / "2.err", now - 10),
        (tmp_path / "3.out", now - 100),
        (tmp_path / "notes.txt", now - 100),
    ]
    assert joblogs.expired(files, {3}, now, 50) == [tmp_path / "1.out"]
    assert joblogs.expired(files, set(), now, 0) == []


async def test_a_sweep_that_fails_is_tried_again_and_the_task_lives_on(tmp_path: Path) -> None:
    logs_dir, real = tmp_path / "logs", tmp_path / "real"
    (tmp_path / "a-file").write_text("")
    logs_dir.symlink_to(tmp_path / "a-file")  # not a directory: scandir fails (as on EMFILE)
    cfg = SimpleNamespace(state_dir=tmp_path, logs=SimpleNamespace(retention=60.0))
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            partial(joblogs.retention_task, cfg, set, every_s=3600, retry_s=0.01)  # type: ignore[arg-type]
        )
        await anyio.sleep(0.1)  # several failed sweeps: the task is still there
        real.mkdir()
        old = real / "7.out"
        old.write_text("done")
        os.utime(old, (1, 1))
        (tmp_path / "next").symlink_to(real)
        (tmp_path / "next").replace(logs_dir)  # at once, with the old log in it
        with anyio.fail_after(10):
            while old.exists():
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    "stamp",
    [
        "1970-01-01T00:00:00.000Z",
        "2000-02-29T23:59:59.500Z",
        "2026-12-01T05:36:30.755Z",
        "2100-03-01T12:00:00.000Z",
        "1999-12-31T00:00:01.001Z",
    ],
)
def test_stamps_read_without_datetime(stamp: str) -> None:
    from datetime import datetime

    from supervisor.client.render import epoch_of

    expected = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    assert epoch_of(stamp) == pytest.approx(expected)


def test_a_config_file_gives_the_client_its_socket_and_a_bad_one_is_a_usage_error(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.toml"
    good.write_text('socket = "/run/elsewhere/gpusvd.sock"\ncpu_slots = 2\n')
    assert config_socket(good) == "/run/elsewhere/gpusvd.sock"
    none = tmp_path / "none.toml"
    none.write_text("cpu_slots = 2\n")
    assert config_socket(none) is None
    bad = tmp_path / "bad.toml"
    bad.write_text("socket = [1]\n")
    with pytest.raises(ConfigError, match="socket"):
        config_socket(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("socket = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config_socket(broken)


@pytest.mark.parametrize(
    ("host_memory", "mem_mb", "shown"),
    [
        (
            {"projected_mb": 65536, "basis": "declared", "runs": 5, "peak_mb": 727},
            65536,
            "~64.0 GiB (declared --mem, larger than the history: 5 earlier runs peaked at 727 MiB)",
        ),
        (
            {"projected_mb": 8192, "basis": "declared", "runs": 0, "peak_mb": None},
            8192,
            "~8.0 GiB (declared --mem; no earlier runs)",
        ),
        (
            {"projected_mb": 3000, "basis": "observed", "runs": 1, "peak_mb": 2857},
            1024,
            "(observed: 1 earlier run peaked at 2.8 GiB) (larger than the declared --mem)",
        ),
    ],
)
def test_show_says_which_figure_admission_uses(
    host_memory: dict[str, Any], mem_mb: int, shown: str
) -> None:
    job = {"id": 1, "state": "queued", "argv": ["x"], "gpus_requested": 0, "mem_mb": mem_mb,
           "host_memory": host_memory, "retries": {"ordinary": {"used": 0, "budget": 3},
           "gpu_hang": {"used": 0, "budget": 20}}}  # fmt: skip
    assert shown in "\n".join(show_lines(job))
