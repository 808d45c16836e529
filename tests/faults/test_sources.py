"""Kernel-log sources on real files, FIFOs and subprocesses; the record parsers on their own."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from supervisor.faults.sources import (
    FileFollower,
    KernelLine,
    SourceDied,
    boot_to_wall,
    follow,
    journal_lines,
    kmsg_lines,
    parse_journal_entry,
    parse_kmsg,
    parse_spec,
    resolve_auto,
    restart_delay,
)

WAIT_S = 20.0  # generous: only ever reached when something is wrong
XID_79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."


async def take(lines: AsyncIterator[KernelLine], n: int) -> list[KernelLine]:
    got: list[KernelLine] = []
    with anyio.fail_after(WAIT_S):
        async for line in lines:
            got.append(line)
            if len(got) == n:
                break
    return got


# --- spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("auto", ("auto", None)),
        ("journal", ("journal", None)),
        (" kmsg ", ("kmsg", None)),
        ("off", ("off", None)),
        ("file:/var/log/kern.log", ("file", "/var/log/kern.log")),
        ("file:relative:with:colons", ("file", "relative:with:colons")),
    ],
)
def test_parse_spec(spec: str, expected: tuple[str, str | None]) -> None:
    assert parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", "dmesg", "file:", "FILE:/x", "journalctl", "Auto"])
def test_parse_spec_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="kernel_log"):
        parse_spec(spec)


# --- pure parsers ----------------------------------------------------------------------------


def test_parse_kmsg_records_continuations_and_escapes() -> None:
    data = (
        b"4,7761,1843308145,c;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: fallen off the bus.\n"
        b" SUBSYSTEM=pci\n"
        b" DEVICE=+pci:0000:b3:00.0\n"
        b"6,7762,1843308200,-,caller=T12;amdgpu 0000:03:00.0: amdgpu: back\\x5cslash\n"
        b"not a record\n"
        b" ORPHAN=continuation\n"
    )
    first, second = parse_kmsg(data)
    assert (first.priority, first.seq, first.usec, first.flags) == (4, 7761, 1843308145, "c")
    assert first.text == "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus."
    assert first.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:b3:00.0"}
    assert (second.seq, second.flags, second.fields) == (7762, "-", {})
    assert second.text == "amdgpu 0000:03:00.0: amdgpu: back\\slash"


def test_parse_kmsg_keeps_a_semicolon_in_the_text() -> None:
    (record,) = parse_kmsg(b"6,1,2,-;a; b; c")
    assert record.text == "a; b; c"


def test_boot_to_wall() -> None:
    assert boot_to_wall(90_000_000, now_wall=1_000_000.0, now_mono=100.0) == 999_990.0
    # A stamp a little ahead of the monotonic clock is not placed in the future.
    assert boot_to_wall(101_000_000, now_wall=1_000_000.0, now_mono=100.0) == 1_000_000.0


def test_parse_journal_entry() -> None:
    entry = {"MESSAGE": XID_79, "__REALTIME_TIMESTAMP": "1700000000250000", "PRIORITY": "4"}
    assert parse_journal_entry(json.dumps(entry)) == KernelLine(XID_79, 1_700_000_000.25)
    as_bytes = {"MESSAGE": list("amdgpu: café".encode()), "__REALTIME_TIMESTAMP": "1000000"}
    assert parse_journal_entry(json.dumps(as_bytes).encode()) == KernelLine("amdgpu: café", 1.0)
    bad_utf8 = {"MESSAGE": [0x61, 0xFF], "__REALTIME_TIMESTAMP": "1000000"}
    assert parse_journal_entry(json.dumps(bad_utf8)) == KernelLine("a\ufffd", 1.0)


@pytest.mark.parametrize(
    "raw",
    ["", "Failed to open journal", "[1, 2]", '{"MESSAGE": null}', '{"OTHER": "x"}'],
)
def test_parse_journal_entry_skips_non_entries(raw: str) -> None:
    assert parse_journal_entry(raw) is None


def test_parse_journal_entry_without_timestamp_uses_now() -> None:
    line = parse_journal_entry('{"MESSAGE": "x"}')
    assert line is not None and line.at > 1_600_000_000


def test_restart_delay_doubles_to_the_cap_and_resets_after_a_healthy_run() -> None:
    delays: list[float] = []
    delay = None
    for _ in range(9):
        delay = restart_delay(delay, ran_s=0.1, low=0.5, high=30.0)
        delays.append(delay)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert restart_delay(30.0, ran_s=45.0, low=0.5, high=30.0) == 0.5


# --- file ------------------------------------------------------------------------------------


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def test_file_starts_at_the_end_and_joins_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old 1\nold 2\n")
    follower = FileFollower(str(log))
    assert follower.poll() == []
    _append(log, "new 1\npar")
    assert follower.poll() == ["new 1"]
    _append(log, "tial\r\n\n")
    assert follower.poll() == ["partial"]
    follower.close()


def test_file_reread_after_truncation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a fairly long first line\n")
    follower = FileFollower(str(log))
    follower.poll()
    log.write_text("after\n")  # copytruncate-style: same inode, shorter
    assert follower.poll() == ["after"]
    follower.close()


def test_file_rotation_drains_the_old_file_then_reads_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    follower = FileFollower(str(log))
    follower.poll()
    os.rename(log, tmp_path / "kern.log.1")
    _append(tmp_path / "kern.log.1", "last of old\ntail without newline")
    assert follower.poll() == ["last of old"]  # followed until a new file appears
    log.write_text("first of new\n")
    assert follower.poll() == ["tail without newline", "first of new"]
    _append(log, "second of new\n")
    assert follower.poll() == ["second of new"]
    follower.close()


def test_file_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "later" / "kern.log"
    follower = FileFollower(str(log))
    assert follower.poll() == []
    log.parent.mkdir()
    log.write_text("first\nsecond\n")
    assert follower.poll() == ["first", "second"]
    follower.close()


def test_file_removed_then_recreated(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x\n")
    follower = FileFollower(str(log))
    follower.poll()
    log.unlink()
    assert follower.poll() == []
    log.write_text("again\n")
    assert follower.poll() == ["again"]
    follower.close()


async def test_follow_file_end_to_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[    1.0] old line, before the source started\n")

    async def keep_appending() -> None:
        # Appends until cancelled, so the test does not depend on when the source opens.
        while True:
            _append(log, f"[ 2.0] {XID_79}\n")
            await anyio.sleep(0.1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_appending)
        async with aclosing(follow(f"file:{log}")) as lines:
            (line,) = await take(lines, 1)
        tg.cancel_scope.cancel()
    assert line.text == f"[ 2.0] {XID_79}"
    assert abs(line.at - time.time()) < 60


# --- kmsg ------------------------------------------------------------------------------------


async def test_kmsg_reads_records_from_a_fifo_and_dies_at_its_end(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # held open: the reader sees no end of file yet
    try:
        os.write(
            writer,
            b"4,100,5000000,c;NVRM: one\\x0atwo\n SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0\n"
            b"3,101,6000000,-;amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n",
        )
        async with aclosing(kmsg_lines(str(fifo))) as lines:
            first, second = await take(lines, 2)
            assert first.text == "NVRM: one\ntwo"
            assert second.text == "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!"
            assert first.at <= second.at
            os.close(writer)
            writer = -1
            with pytest.raises(SourceDied), anyio.fail_after(WAIT_S):
                await lines.__anext__()
    finally:
        if writer >= 0:
            os.close(writer)


async def test_kmsg_on_the_real_device_sees_a_new_record() -> None:
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not writable here: {exc}")
    marker = f"gpusv test: kmsg source check {os.getpid()}"

    async def keep_writing() -> None:
        # Until cancelled: the source skips what was logged before it opened the device.
        while True:
            os.write(fd, marker.encode())
            await anyio.sleep(0.2)

    try:
        async with anyio.create_task_group() as tg, aclosing(kmsg_lines()) as lines:
            tg.start_soon(keep_writing)
            with anyio.fail_after(WAIT_S):
                async for line in lines:
                    if line.text == marker:
                        break
            tg.cancel_scope.cancel()
    finally:
        os.close(fd)


# --- journal ---------------------------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "fake_journalctl.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script)]


async def test_journal_lines_from_a_process_and_its_exit(tmp_path: Path) -> None:
    argv = _script(
        tmp_path,
        f"""
        import json, sys
        print(json.dumps({{"MESSAGE": {XID_79!r}, "__REALTIME_TIMESTAMP": "1700000000000000"}}))
        print(json.dumps({{"MESSAGE": list(b"amdgpu: two\\nlines"), "__REALTIME_TIMESTAMP": "5"}}))
        print("Failed to open journal: Permission denied")
        sys.stdout.flush()
        sys.exit(3)
        """,
    )
    got: list[KernelLine] = []
    with pytest.raises(SourceDied, match=r"status 3: Failed to open journal"):
        with anyio.fail_after(WAIT_S):
            async with aclosing(journal_lines(argv)) as lines:
                async for line in lines:
                    got.append(line)
    assert got == [KernelLine(XID_79, 1_700_000_000.0), KernelLine("amdgpu: two\nlines", 5e-6)]


async def test_closing_the_journal_source_stops_its_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    argv = _script(
        tmp_path,
        f"""
        import json, os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        print(json.dumps({{"MESSAGE": "x", "__REALTIME_TIMESTAMP": "1"}}), flush=True)
        time.sleep(600)
        """,
    )
    async with aclosing(journal_lines(argv)) as lines:
        await take(lines, 1)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # terminated and reaped


# --- follow ----------------------------------------------------------------------------------


async def test_follow_restarts_a_failing_source_and_reports_it() -> None:
    calls = 0

    async def flaky(kind: str, arg: str | None) -> AsyncGenerator[KernelLine, None]:
        nonlocal calls
        calls += 1
        yield KernelLine(f"{kind} line {calls}", 0.0)
        if calls == 1:
            raise PermissionError("kmsg: operation not permitted")
        await anyio.sleep_forever()

    restarts: list[tuple[str, BaseException]] = []
    source = follow(
        "kmsg", on_restart=lambda s, e: restarts.append((s, e)), factory=flaky, min_backoff_s=0.01
    )
    async with aclosing(source) as lines:
        got = await take(lines, 2)
    assert [g.text for g in got] == ["kmsg line 1", "kmsg line 2"]
    assert len(restarts) == 1
    spec, error = restarts[0]
    assert spec == "kmsg" and isinstance(error, PermissionError)


async def test_follow_restarts_a_journal_process_that_exits(tmp_path: Path) -> None:
    argv = _script(
        tmp_path,
        """
        import json
        print(json.dumps({"MESSAGE": "NVRM: hello", "__REALTIME_TIMESTAMP": "1"}), flush=True)
        """,
    )
    restarts: list[BaseException] = []
    source = follow(
        "journal",
        on_restart=lambda _spec, e: restarts.append(e),
        factory=lambda _kind, _arg: journal_lines(argv),
        min_backoff_s=0.01,
    )
    async with aclosing(source) as lines:
        got = await take(lines, 3)
    assert [g.text for g in got] == ["NVRM: hello"] * 3
    assert len(restarts) >= 2
    assert all(isinstance(e, SourceDied) and "status 0" in str(e) for e in restarts)


async def test_follow_off_yields_nothing_and_never_restarts() -> None:
    restarts: list[BaseException] = []
    async with aclosing(follow("off", on_restart=lambda _s, e: restarts.append(e))) as lines:
        with anyio.move_on_after(0.3):
            async for line in lines:
                pytest.fail(f"unexpected line {line}")
    assert restarts == []


async def test_follow_rejects_a_bad_spec() -> None:
    with pytest.raises(ValueError, match="kernel_log"):
        await follow("dmesg").__anext__()


async def test_resolve_auto_without_systemd(tmp_path: Path) -> None:
    readable = tmp_path / "kmsg"
    readable.write_text("")
    no_systemd = str(tmp_path / "no-systemd")
    assert await resolve_auto(systemd_dir=no_systemd, kmsg_path=str(readable)) == "kmsg"
    missing = str(tmp_path / "missing")
    assert await resolve_auto(systemd_dir=no_systemd, kmsg_path=missing) == "off"
