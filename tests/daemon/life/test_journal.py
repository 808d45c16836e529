"""The daemon's logging under journald: entries sent over the native protocol to a real
AF_UNIX datagram socket standing in for /run/systemd/journal/socket, read back field by
field; the GPUSV_* fields of the events' lines; the three MESSAGE_IDs."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from supervisor.core.commands import SaveJob
from supervisor.core.jobs import FailureReason, Job, JobSpec, JobState
from supervisor.core.records import Attempt, Event
from supervisor.daemon.event_log import JobLines
from supervisor.daemon.life import journal
from supervisor.daemon.life import log_setup as logs

Entry = dict[str, list[str]]


@pytest.fixture
def out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TextIO]:
    """The daemon's stream, which $JOURNAL_STREAM names: as systemd sets it for a unit."""
    with (tmp_path / "stream.txt").open("w") as stream:
        info = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
        yield stream


@pytest.fixture
def journal_socket(tmp_path: Path) -> Iterator[socket.socket]:
    # AF_UNIX paths are short (108 bytes): pytest's tmp_path may be longer.
    path = Path(f"/tmp/gpusv-journal-{os.getpid()}-{id(tmp_path)}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    try:
        yield sock
    finally:
        sock.close()
        path.unlink(missing_ok=True)


def parse(datagram: bytes) -> Entry:
    """journald's native protocol: `KEY=value\\n`, or `KEY\\n` + 64-bit LE length + value
    + `\\n` for a value that holds a newline (systemd's JOURNAL_NATIVE_PROTOCOL)."""
    entry: Entry = {}
    rest = datagram
    while rest:
        head, sep, tail = rest.partition(b"\n")
        assert sep, f"unterminated field {head!r}"
        if b"=" in head:
            key, _, value = head.partition(b"=")
            rest = tail
        else:
            key = head
            (size,) = struct.unpack("<Q", tail[:8])
            value, rest = tail[8 : 8 + size], tail[8 + size :]
            assert rest[:1] == b"\n"
            rest = rest[1:]
        entry.setdefault(key.decode(), []).append(value.decode())
    return entry


def receive(sock: socket.socket) -> bytes:
    """One entry: the datagram, or the sealed memfd it passed when it was too big."""
    data, ancillary, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            (fd,) = struct.unpack("i", payload[:4])
            with os.fdopen(fd, "rb") as memfd:
                memfd.seek(0)
                return memfd.read()
    return data


def received(sock: socket.socket, count: int) -> list[Entry]:
    return [parse(receive(sock)) for _ in range(count)]


def nothing_more(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(1 << 20)
    except BlockingIOError:
        return True
    return False


def start(out: TextIO, sock: socket.socket, fmt: str = "console") -> None:
    logs.configure("json" if fmt == "json" else "console", "debug", out, Path(sock.getsockname()))


def test_an_event_becomes_one_entry_with_its_fields(
    out: TextIO, journal_socket: socket.socket
) -> None:
    start(out, journal_socket)
    logs.get_logger("gpusvd.events").warning(
        "attempt failed",
        event_kind="exited",
        job_id=42,
        attempt=2,
        gpus=[0, 3],
        gpu_uuids=["GPU-a", "GPU-b"],
        reason="exit_nonzero",
    )
    (entry,) = received(journal_socket, 1)
    assert entry["PRIORITY"] == ["4"]
    assert entry["SYSLOG_IDENTIFIER"] == ["gpusvd"]
    assert entry["GPUSV_JOB"] == ["42"] and entry["GPUSV_ATTEMPT"] == ["2"]
    assert entry["GPUSV_CARD"] == ["0", "3"]  # one field, two values: either card selects it
    assert entry["GPUSV_GPU_UUID"] == ["GPU-a", "GPU-b"]
    assert entry["GPUSV_REASON"] == ["exit_nonzero"] and entry["GPUSV_EVENT"] == ["exited"]
    assert entry["GPUSV_LOGGER"] == ["gpusvd.events"]
    assert "MESSAGE_ID" not in entry
    (message,) = entry["MESSAGE"]
    assert message.startswith("[warning  ] attempt failed") and "job_id=42" in message
    assert "timestamp" not in message and not message[:4].isdigit()  # journald stamps it
    assert Path(out.name).read_text() == ""  # nothing on the stream besides


def test_priorities_follow_the_levels(out: TextIO, journal_socket: socket.socket) -> None:
    start(out, journal_socket, "json")
    log = logs.get_logger()
    for method in (log.debug, log.info, log.warning, log.error, log.critical):
        method("m")
    entries = received(journal_socket, 5)
    assert [e["PRIORITY"] for e in entries] == [["7"], ["6"], ["4"], ["3"], ["2"]]
    assert all("GPUSV_JOB" not in e for e in entries)


def test_a_traceback_stays_in_its_entry(out: TextIO, journal_socket: socket.socket) -> None:
    start(out, journal_socket)
    try:
        raise ValueError("deep")
    except ValueError:
        logs.get_logger().exception("abort failed", job_id=7)
    (entry,) = received(journal_socket, 1)
    assert entry["PRIORITY"] == ["3"] and entry["GPUSV_JOB"] == ["7"]
    (message,) = entry["MESSAGE"]
    assert message.count("\n") > 2 and "ValueError: deep" in message


def test_stdlib_warnings_reach_the_journal(out: TextIO, journal_socket: socket.socket) -> None:
    start(out, journal_socket, "json")
    logging.getLogger("aiosqlite").info("chatter")
    logging.getLogger("aiosqlite").error("slow commit: %d ms", 250)
    (entry,) = received(journal_socket, 1)
    assert entry["PRIORITY"] == ["3"] and entry["GPUSV_LOGGER"] == ["aiosqlite"]
    assert '"event": "slow commit: 250 ms"' in entry["MESSAGE"][0]
    assert nothing_more(journal_socket)


def test_outside_journald_nothing_is_sent(
    tmp_path: Path, journal_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    with (tmp_path / "plain.txt").open("w") as stream:
        logs.configure("console", "info", stream, Path(journal_socket.getsockname()))
        logs.get_logger().info("plain", job_id=1)
    assert nothing_more(journal_socket)
    assert "job_id=1" in (tmp_path / "plain.txt").read_text()


def job(state: JobState, reason: FailureReason | None = None) -> Job:
    return Job(42, JobSpec(("train",), "/", {}, 1, 0), state, reason=reason)


def attempt(reason: str | None) -> Attempt:
    return Attempt(42, 2, (1, 2), "t", "k", gpu_uuids=("GPU-x", "GPU-y"), reason=reason)


def test_a_jobs_lines_carry_its_attempt_cards_and_reason(
    out: TextIO, journal_socket: socket.socket
) -> None:
    """An OOM kill and a hang as the engine logs them once committed."""
    start(out, journal_socket)
    oom = FailureReason.OOM_KILLED
    hang = FailureReason.GPU_HANG
    JobLines(0).log(
        [
            SaveJob(
                job(JobState.FAILED, oom),
                "t",
                (Event("exited", "oom_killed: killed", {"reason": "oom_killed"}),),
                ended_attempt=attempt("oom_killed"),
            ),
            SaveJob(
                job(JobState.QUEUED, hang),
                "t",
                (Event("gpu_hang", "attempt failed as gpu_hang"),),
                ended_attempt=attempt("gpu_hang"),
            ),
        ]
    )
    oom_entry, hang_entry = received(journal_socket, 2)
    assert oom_entry["PRIORITY"] == hang_entry["PRIORITY"] == ["4"]  # `journalctl -p warning`
    assert oom_entry["MESSAGE_ID"] == [journal.OOM_KILLED]
    assert oom_entry["GPUSV_EVENT"] == ["exited"] and oom_entry["GPUSV_REASON"] == ["oom_killed"]
    assert hang_entry["MESSAGE_ID"] == [journal.GPU_HANG]
    assert hang_entry["GPUSV_REASON"] == ["gpu_hang"]
    for entry in (oom_entry, hang_entry):
        assert entry["GPUSV_JOB"] == ["42"] and entry["GPUSV_ATTEMPT"] == ["2"]
        assert entry["GPUSV_CARD"] == ["1", "2"]
        assert entry["GPUSV_GPU_UUID"] == ["GPU-x", "GPU-y"]


def test_a_jobs_own_failure_is_told_at_info(out: TextIO, journal_socket: socket.socket) -> None:
    start(out, journal_socket)
    exited = Event("exited", "exit_nonzero: exited 3", {"reason": "exit_nonzero"})
    failed = job(JobState.FAILED, FailureReason.EXIT_NONZERO)
    JobLines(0).log([SaveJob(failed, "t", (exited,), ended_attempt=attempt("exit_nonzero"))])
    (entry,) = received(journal_socket, 1)
    assert entry["PRIORITY"] == ["6"] and "MESSAGE_ID" not in entry
    assert entry["GPUSV_REASON"] == ["exit_nonzero"] and entry["GPUSV_JOB"] == ["42"]


def test_the_three_message_ids_are_distinct_128_bit_ids() -> None:
    ids = {journal.DEADMAN_EXIT, journal.GPU_HANG, journal.OOM_KILLED}
    assert len(ids) == 3
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert journal.message_id({"event_kind": "deadman_exit"}) == journal.DEADMAN_EXIT
    assert journal.message_id({"event_kind": "exited", "reason": "signal"}) is None
    assert journal.message_id({"event_kind": "retry_scheduled", "reason": "oom_killed"}) is None


def test_a_refused_entry_becomes_a_prefixed_line(tmp_path: Path, out: TextIO) -> None:
    logs.configure("console", "info", out, tmp_path / "nobody-listens")
    logs.get_logger().error("lost card", gpu=1)
    (line,) = Path(out.name).read_text().splitlines()
    assert line.startswith("<3>[error    ] lost card") and "gpu=1" in line


DEADMAN_SCRIPT = """
import os, sys, threading, time
from pathlib import Path
from supervisor.daemon.life import log_setup as logs
from supervisor.daemon.life.deadman import Deadman
stream = open(sys.argv[1], "w")
info = os.fstat(stream.fileno())
os.environ["JOURNAL_STREAM"] = f"{info.st_dev}:{info.st_ino}"
logs.configure("console", "info", stream, Path(sys.argv[2]))
deadman = Deadman(1.0)
deadman.start()
deadman.run_abort(threading.Event().wait, "job-17")   # blocks for ever
time.sleep(60)
"""


def test_the_deadmans_exit_is_an_entry_with_its_message_id(
    tmp_path: Path, journal_socket: socket.socket
) -> None:
    """A real deadman in a real process: its last words reach the journal before exit 70."""
    argv = [sys.executable, "-c", textwrap.dedent(DEADMAN_SCRIPT)]
    argv += [str(tmp_path / "stderr.txt"), journal_socket.getsockname()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 70, done.stderr
    entries = received(journal_socket, 1)
    while not nothing_more_soon(journal_socket):  # anything logged before it
        entries += received(journal_socket, 1)
    (entry,) = [e for e in entries if "MESSAGE_ID" in e]
    assert entry["MESSAGE_ID"] == [journal.DEADMAN_EXIT] and entry["PRIORITY"] == ["2"]
    assert entry["GPUSV_EVENT"] == ["deadman_exit"]
    assert "abort wedged" in entry["MESSAGE"][0] and "job-17" in entry["MESSAGE"][0]


def nothing_more_soon(sock: socket.socket) -> bool:
    """The process has exited, so all it sent is queued already."""
    sock.setblocking(False)
    try:
        data = sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(10)
    return data is None
