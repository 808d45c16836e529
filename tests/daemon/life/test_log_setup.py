"""Tests for supervisor.daemon.life.log_setup: formats, the journald priority prefix (the
lines written when the journal's socket refuses an entry; test_journal.py sends them), the
stdlib bridge."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TextIO

import pytest
import structlog

from supervisor.daemon.life import log_setup as logs

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.fixture
def out(tmp_path: Path) -> Iterator[TextIO]:
    with (tmp_path / "log.txt").open("w") as stream:
        yield stream


def lines_of(stream: TextIO) -> list[str]:
    # Read by name: the lines must already be on disk, with no flush of ours.
    return Path(stream.name).read_text().splitlines()


def mark_as_journal(stream: TextIO, monkeypatch: pytest.MonkeyPatch) -> None:
    info = os.fstat(stream.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")


@pytest.fixture
def no_journal(tmp_path: Path) -> Path:
    """A journal socket path where nothing listens (never the host's journal)."""
    return tmp_path / "no-journal-socket"


def test_json_lines_are_parseable(out: TextIO) -> None:
    logs.configure("json", stream=out)
    log = logs.get_logger("sched")
    log.info("job started", job=7, gpus=[0, 1])
    log.debug("not shown at info")
    logs.get_logger().warning("anonymous")
    records = [json.loads(line) for line in lines_of(out)]
    assert len(records) == 2
    first = records[0]
    assert first["event"] == "job started" and first["level"] == "info"
    assert first["job"] == 7 and first["gpus"] == [0, 1] and first["logger"] == "sched"
    assert ISO_UTC.match(first["timestamp"])
    assert records[1]["level"] == "warning" and "logger" not in records[1]


def test_json_exception_is_one_line(out: TextIO) -> None:
    logs.configure("json", stream=out)
    try:
        raise RuntimeError("kaboom")
    except RuntimeError:
        logs.get_logger().exception("failed")
    (line,) = lines_of(out)
    record = json.loads(line)
    assert record["level"] == "error" and "RuntimeError: kaboom" in record["exception"]


def test_console_has_key_value_pairs(out: TextIO) -> None:
    logs.configure("console", stream=out)
    logs.get_logger("server").warning("peer refused", uid=1000, reason="not owner")
    (line,) = lines_of(out)
    assert ISO_UTC.match(line)
    assert "peer refused" in line and "warning" in line and "server" in line
    assert "uid=1000" in line and "reason='not owner'" in line
    assert "\x1b[" not in line  # no colours into a file


def test_level_filters(out: TextIO) -> None:
    logs.configure("json", level="error", stream=out)
    log = logs.get_logger()
    log.warning("dropped")
    log.error("kept")
    assert [json.loads(line)["event"] for line in lines_of(out)] == ["kept"]
    with pytest.raises(ValueError, match="log level"):
        logs.configure("json", level="verbose", stream=out)


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_journald_lines_carry_priority_and_no_timestamp(
    out: TextIO, monkeypatch: pytest.MonkeyPatch, fmt: str, no_journal: Path
) -> None:
    mark_as_journal(out, monkeypatch)
    form: Literal["console", "json"] = "json" if fmt == "json" else "console"
    logs.configure(form, level="debug", stream=out, journal_socket=no_journal)
    log = logs.get_logger("deadman")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    lines = lines_of(out)
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    for line in lines:
        assert "timestamp" not in line and not ISO_UTC.match(line[3:])
    if fmt == "json":
        assert json.loads(lines[2][3:])["event"] == "w"


def test_journald_prefixes_every_traceback_line(
    out: TextIO, monkeypatch: pytest.MonkeyPatch, no_journal: Path
) -> None:
    mark_as_journal(out, monkeypatch)
    logs.configure("console", stream=out, journal_socket=no_journal)
    try:
        raise ValueError("deep")
    except ValueError:
        logs.get_logger().exception("abort failed")
    lines = lines_of(out)
    assert len(lines) > 2
    assert all(line.startswith("<3>") for line in lines)
    assert any("ValueError: deep" in line for line in lines)


def test_other_journal_stream_means_no_prefix(
    out: TextIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (tmp_path / "other").open("w") as other:
        mark_as_journal(other, monkeypatch)
    logs.configure("console", stream=out)
    logs.get_logger().info("plain")
    (line,) = lines_of(out)
    assert not line.startswith("<") and ISO_UTC.match(line)


def test_under_journald_needs_a_real_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    assert not logs.under_journald(io.StringIO())


def test_stdlib_logging_is_bridged_from_warning(out: TextIO) -> None:
    logs.configure("json", level="debug", stream=out)
    library = logging.getLogger("aiosqlite")
    library.info("chatter")
    library.warning("slow commit: %d ms", 250)
    (line,) = lines_of(out)
    record = json.loads(line)
    assert record["event"] == "slow commit: 250 ms"
    assert record["level"] == "warning" and record["logger"] == "aiosqlite"
    assert ISO_UTC.match(record["timestamp"])


def test_configure_twice_replaces_the_setup(tmp_path: Path) -> None:
    with (tmp_path / "a").open("w") as first, (tmp_path / "b").open("w") as second:
        logs.configure("console", stream=first)
        module_level = logs.get_logger("early")
        logs.configure("json", stream=second)
        module_level.info("after")
        logging.getLogger("anyio").error("bridged once")
        assert lines_of(first) == []
        records = [json.loads(line) for line in lines_of(second)]
    assert [r["event"] for r in records] == ["after", "bridged once"]
    assert records[0]["logger"] == "early"


def test_threads_write_whole_lines(out: TextIO) -> None:
    logs.configure("json", stream=out)
    log = logs.get_logger()

    def burst(n: int) -> None:
        for i in range(200):
            log.info("tick", thread=n, i=i, pad="x" * 200)

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = [json.loads(line) for line in lines_of(out)]
    assert len(records) == 800
    assert {(r["thread"], r["i"]) for r in records} == {
        (n, i) for n in range(4) for i in range(200)
    }


def test_line_logged_right_before_os_exit_survives(tmp_path: Path) -> None:
    """The deadman logs at CRITICAL and then calls os._exit: the line must be out, even
    on a block-buffered stream, since os._exit flushes nothing."""
    code = (
        "import os, sys, threading\n"
        "from supervisor.daemon.life import log_setup as logs\n"
        "logs.configure('json', stream=open(sys.argv[1], 'w', buffering=65536))\n"
        "def deadman():\n"
        "    logs.get_logger('deadman').critical('abort wedged', deadline_s=60)\n"
        "    os._exit(70)\n"
        "threading.Thread(target=deadman).start()\n"
        "threading.Event().wait(60)\n"
    )
    target = tmp_path / "stderr.log"
    done = subprocess.run([sys.executable, "-c", code, str(target)], timeout=60, check=False)
    assert done.returncode == 70
    record = json.loads(target.read_text().strip().splitlines()[-1])
    assert record["event"] == "abort wedged" and record["level"] == "critical"


def test_import_does_not_load_structlog() -> None:
    code = "import sys, supervisor.daemon.life.log_setup; print('structlog' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
