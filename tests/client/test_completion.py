"""Completion for bash, zsh and fish: generated from the parser, checked by each shell
that is here, and job ids completed from what `gpusv list` prints (a stand-in gpusv on
PATH prints a table as the real one does)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from supervisor.client import parser as cli_parser
from supervisor.client.completion import _id_commands, script

TABLE = """ID  STATE    USER  GPUS  CARDS  EXIT  TIME  AGE  NAME/COMMAND  NOTE
12  queued   me    1     -      -     -     3s   train         paused
7   running  me    2     0,1    -     1m    2m   enc-a
"""


@pytest.fixture
def fake_gpusv(tmp_path: Path) -> dict[str, str]:
    """A PATH whose gpusv writes its arguments to `args` and prints TABLE."""
    exe = tmp_path / "gpusv"
    exe.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat <<"X"\n{TABLE}X\n')
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_the_commands_that_take_ids_are_found_in_the_parser() -> None:
    found = set(_id_commands(cli_parser.parser()))
    assert {"show", "logs", "wait", "cancel", "restart", "hold", "release"} <= found
    assert not found & {"list", "submit", "run", "gpus", "pause"}


def test_bash_completes_job_ids_from_the_list(fake_gpusv: dict[str, str]) -> None:
    bash = script(cli_parser.parser(), "bash")
    probe = (
        f"{bash}\nCOMP_WORDS=(gpusv cancel ''); COMP_CWORD=2; _gpusv; echo ${{COMPREPLY[@]}}"
        "\nCOMP_WORDS=(gpusv show 1); COMP_CWORD=2; _gpusv; echo ${COMPREPLY[@]}"
    )
    done = subprocess.run(["bash", "-c", probe], text=True, capture_output=True, env=fake_gpusv)
    assert done.stdout.splitlines() == ["12 7", "12"], done.stderr


def test_bash_asks_the_daemon_the_command_line_names(
    tmp_path: Path, fake_gpusv: dict[str, str]
) -> None:
    bash = script(cli_parser.parser(), "bash")
    words = "(gpusv --socket /s.sock --connect-timeout = 5 wait '')"  # bash splits at '='
    probe = f"{bash}\nCOMP_WORDS={words}; COMP_CWORD=7; _gpusv; echo ${{COMPREPLY[@]}}"
    done = subprocess.run(["bash", "-c", probe], text=True, capture_output=True, env=fake_gpusv)
    assert done.stdout.split() == ["12", "7"], done.stderr
    assert (tmp_path / "args").read_text().split() == [
        "--socket", "/s.sock", "--connect-timeout", "5", "list"
    ]  # fmt: skip
    values = f"{bash}\nCOMP_WORDS=(gpusv --socket ''); COMP_CWORD=2; _gpusv; echo ${{COMPREPLY[@]}}"
    done = subprocess.run(["bash", "-c", values], text=True, capture_output=True, cwd=tmp_path)
    assert "gpusv" in done.stdout.split() and "submit" not in done.stdout.split()  # a path


@pytest.mark.skipif(not shutil.which("fish"), reason="fish is not installed")
def test_fish_completes_commands_options_and_ids(
    tmp_path: Path, fake_gpusv: dict[str, str]
) -> None:
    fish = tmp_path / "gpusv.fish"
    fish.write_text(script(cli_parser.parser(), "fish"))
    checked = subprocess.run(["fish", "-n", str(fish)], text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr

    def complete(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {fish}; complete -C '{line}'"],
            text=True,
            capture_output=True,
            env=fake_gpusv,
        )
        assert done.returncode == 0, done.stderr
        return sorted(done.stdout.splitlines())

    assert complete("gpusv res") == ["restart\tqueue a new job with the same spec; prints its id",
                                     "resume\tstart jobs again"]  # fmt: skip
    assert complete("gpusv cancel ") == ["12\tqueued", "7\trunning"]
    assert complete("gpusv --socket /s.sock show ") == ["12\tqueued", "7\trunning"]
    assert (tmp_path / "args").read_text().split() == ["--socket", "/s.sock", "list"]
    assert "--name\tonly jobs whose name matches (* ? [...])" in complete("gpusv list --na")
    assert complete("gpusv completion ") == ["bash", "fish", "zsh"]


@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_zsh_reads_the_script() -> None:
    zsh = script(cli_parser.parser(), "zsh")
    done = subprocess.run(["zsh", "-n"], input=zsh, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert "ids=1" in zsh and "_describe 'job' jobs" in zsh
