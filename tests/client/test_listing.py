"""`gpusv list` at a glance (GPUS asked and CARDS held, EXIT, TIME, a paused queue in
NOTE), its filters, and usage errors: the subcommand's own usage, a suggestion, exit 2."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.client.cli import is_usage, main
from supervisor.client.connection import Refused
from supervisor.client.listing import list_request
from supervisor.client.render import LIST_HEADER, list_lines, run_time, shell_join, show_lines
from supervisor.client.usage import did_you_mean
from supervisor.wire.sizes import ConfigError

NOW = 1767322800.0  # 2026-01-02T03:00:00.000Z


def job(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 1,
        "state": "queued",
        "owner_uid": 0,
        "name": "",
        "argv": ["true"],
        "gpus": [],
        "gpus_requested": 1,
        "submitted_at": "2026-01-02T02:00:00.000Z",
        "started_at": None,
        "ended_at": None,
        "exit_code": None,
        "reason": None,
        "waiting_for": None,
        "held": False,
    }
    return {**base, **kw}


def row(j: dict[str, Any], paused: bool = False) -> dict[str, str]:
    header, line = list_lines([j], paused=paused)
    starts = [header.index(name) for name in LIST_HEADER]  # the cells line up under them
    ends = [*starts[1:], None]
    return {n: line[a:b].strip() for n, a, b in zip(LIST_HEADER, starts, ends, strict=True)}


def test_gpus_is_the_count_asked_and_cards_the_cards_held() -> None:
    cpu = row(job(gpus_requested=0))
    assert (cpu["GPUS"], cpu["CARDS"]) == ("0", "-")
    running = job(state="running", gpus=[0], started_at="2026-01-02T02:59:00.000Z")
    assert row(running)["GPUS"] == "1" and row(running)["CARDS"] == "0"
    two = job(state="succeeded", gpus=[1, 3], gpus_requested=2, exit_code=0)
    assert (row(two)["GPUS"], row(two)["CARDS"]) == ("2", "1,3")
    retry = job(state="queued", gpus=[2], started_at="2026-01-02T02:59:00.000Z")
    assert row(retry)["CARDS"] == "-" and row(retry)["TIME"] == "-"  # it holds none now


def test_exit_and_run_time() -> None:
    ended = job(
        state="failed",
        exit_code=137,
        reason="signal",
        started_at="2026-01-02T02:00:00.000Z",
        ended_at="2026-01-02T02:02:00.000Z",
    )
    assert row(ended)["EXIT"] == "137" and row(ended)["TIME"] == "2m"
    assert row(ended)["NOTE"] == "signal"
    assert row({**ended, "progress": "Fra:942"})["NOTE"] == "signal; Fra:942"
    assert row(job())["EXIT"] == "-" and row(job())["TIME"] == "-"
    running = job(state="running", started_at="2026-01-02T02:59:50.000Z")
    assert run_time(running, NOW) == "10s"


def test_a_paused_queue_shows_on_queued_jobs_and_in_show() -> None:
    waiting = job(waiting_for="waiting for 2 free GPUs")
    assert row(waiting, paused=True)["NOTE"] == "paused; waiting for 2 free GPUs"
    assert row(waiting)["NOTE"] == "waiting for 2 free GPUs"
    held = job(held=True, waiting_for="held (gpusv release 1)")
    assert row(held, paused=True)["NOTE"] == "paused; held (gpusv release 1)"
    assert row(job(held=True))["NOTE"] == "held"
    running = job(state="running", started_at="2026-01-02T02:59:50.000Z")
    assert row(running, paused=True)["NOTE"] == ""  # it goes on: a pause holds only starts
    budgets = {"ordinary": {"used": 0, "budget": 3}, "gpu_hang": {"used": 0, "budget": 20}}
    page = "\n".join(show_lines(job(retries=budgets), paused=True))
    assert "the queue is paused: gpusv resume" in page
    assert "paused" not in "\n".join(show_lines(job(retries=budgets)))


def args(**kw: Any) -> SimpleNamespace:
    base = {"limit": 1000, "state": None, "user": None, "mine": False, "all": False}
    return SimpleNamespace(**{**base, "array": None, "name": None, "label": None, **kw})


def test_filters_go_to_the_daemon() -> None:
    request = list_request(args(name="enc-*", label=["kind=enc", "codec=av1"]))
    assert request["name"] == "enc-*"
    assert request["labels"] == {"kind": "enc", "codec": "av1"}
    assert "name" not in list_request(args()) and "labels" not in list_request(args())
    assert list_request(args(state="running, queued"))["states"] == ["running", "queued"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"state": "runing"}, "unknown state 'runing' (did you mean 'running'?)"),
        ({"state": "queued,typo"}, "unknown state 'typo'; the states are queued, running"),
        ({"label": ["kind"]}, "--label: expected K=V, got 'kind'"),
        ({"label": ["=x"]}, "--label: expected K=V"),
    ],
)
def test_bad_filters_are_usage_errors(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        list_request(args(**kw))


def test_suggestions_only_when_close() -> None:
    options = ["--gpus", "--time", "--user", "--mine"]
    assert did_you_mean("--gpuss", options) == " (did you mean '--gpus'?)"
    assert did_you_mean("--tme", options) == " (did you mean '--time'?)"
    assert did_you_mean("--bogus", options) == ""  # the shared dashes do not count
    assert did_you_mean("lsit", ["list", "show"]) == " (did you mean 'list'?)"


def usage_error(*argv: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        main(list(argv))
    assert stop.value.code == 2
    return err.getvalue()


@pytest.mark.parametrize(
    ("argv", "usage", "says"),
    [
        (["list", "--stat", "x", "--bogus"], "usage: gpusv list ", "unrecognized arguments"),
        (["submit", "--gpuss", "2", "--", "true"], "usage: gpusv submit ", "'--gpus'?"),
        (["list", "--tme", "5"], "usage: gpusv list ", "unrecognized arguments: --tme"),
        (["lsit"], "usage: gpusv [-h]", "did you mean 'list'?"),
        (["list", "--socket", "/x"], "usage: gpusv list ", "give it before the command"),
        (["list", "--state", "typo"], "usage: gpusv list ", "unknown state 'typo'"),
        (["wait", "--timeout", "5x", "1"], "usage: gpusv wait ", "--timeout: must be"),
        (["completion", "fsh"], "usage: gpusv completion ", "did you mean 'fish'?"),
    ],
)
def test_a_usage_error_shows_the_commands_own_usage_and_exits_2(
    argv: list[str], usage: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSV_SOCKET", "/nonexistent/gpusvd.sock")  # never reached
    text = usage_error(*argv)
    assert text.startswith(usage) and says in text, text


def test_a_typed_value_the_daemon_refuses_is_bad_usage() -> None:
    assert is_usage(Refused("bad_request", "field 'limit': must be between 1 and 10000, got 0"))
    assert not is_usage(Refused("bad_request", "asks for 5 GPUs; this machine has 4"))
    assert not is_usage(Refused("bad_request", "unknown field 'name'"))  # an older daemon
    assert not is_usage(Refused("not_found", "field 'limit': nothing"))


@given(st.lists(st.text(), max_size=4) | st.lists(st.text(alphabet="a_@%+=:,./-'\" é$*\t\n")))
def test_commands_are_quoted_as_shlex_quotes_them(argv: list[str]) -> None:
    assert shell_join(argv) == shlex.join(argv)
