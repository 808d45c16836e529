"""A kernel-log source that restarts goes on where it stopped (journal cursor, kmsg
sequence number, file offset), and keeps the device the kernel filed a line under."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from supervisor.faults.records import (
    Resume,
    device_bus_id,
    journal_entry,
    kmsg_line,
    parse_kmsg,
)
from supervisor.faults.sources import (
    FileFollower,
    KernelLine,
    SourceDied,
    journal_argv,
    journal_lines,
    kmsg_lines,
)

WAIT_S = 20.0  # generous: only ever reached when something is wrong


async def until(lines: AsyncGenerator[KernelLine, None], last: str) -> list[str]:
    """Texts read up to and including `last`."""
    got: list[str] = []
    with anyio.fail_after(WAIT_S):
        async for line in lines:
            got.append(line.text)
            if line.text == last:
                return got
    raise AssertionError(f"source ended before {last!r}")


# --- the device field ------------------------------------------------------------------------


def test_device_fields_attribute_a_line_to_its_card() -> None:
    assert device_bus_id("+pci:0000:3B:00.0") == "0000:3b:00.0"
    assert device_bus_id("c226:0") is None and device_bus_id(None) is None
    (record,) = parse_kmsg(b"3,7,1,-;amdgpu: ring gfx timeout\n DEVICE=+pci:0000:c1:00.0\n")
    assert kmsg_line(record, 100.0, 1.0).device == "0000:c1:00.0"
    raw = {"MESSAGE": "NVRM: x", "__CURSOR": "s=1;i=2", "_KERNEL_DEVICE": "+pci:0000:01:00.0"}
    parsed = journal_entry(json.dumps(raw))
    assert parsed is not None
    line, cursor = parsed
    assert (line.device, cursor) == ("0000:01:00.0", "s=1;i=2")


def test_journal_restart_goes_on_after_the_cursor() -> None:
    argv = ("journalctl", "-k", "-f", "-o", "json", "-n", "0", "--all")
    assert journal_argv(argv, None) == list(argv)
    assert journal_argv(argv, "s=1;i=9") == [
        "journalctl", "-k", "-f", "-o", "json", "--all", "--after-cursor=s=1;i=9"
    ]  # fmt: skip


# --- no line lost across a restart -----------------------------------------------------------


def test_file_source_restart_loses_no_line(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line, before start\n")
    resume = Resume()
    first = FileFollower(str(log), resume)
    assert first.poll() == []  # opened at the end
    with log.open("a") as fh:
        fh.write("one\ntw")
    assert first.poll() == ["one"]
    first.close()
    with log.open("a") as fh:  # logged while the source was down
        fh.write("o\nthree\n")
    assert FileFollower(str(log), resume).poll() == ["two", "three"]


async def test_kmsg_source_restart_loses_no_line() -> None:
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not writable here: {exc}")
    tag = f"gpusv test {os.getpid()}: kmsg resume"
    resume = Resume()
    written: list[str] = []

    async def keep_writing() -> None:
        # Until cancelled: the source skips what was logged before it opened the device.
        while True:
            written.append(f"{tag} a{len(written)}")
            # With its newline: the kernel does not hand out a record until it is finished.
            os.write(fd, f"{written[-1]}\n".encode())
            await anyio.sleep(0.1)

    try:
        async with anyio.create_task_group() as tg, aclosing(kmsg_lines(resume=resume)) as lines:
            tg.start_soon(keep_writing)
            with anyio.fail_after(WAIT_S):
                async for line in lines:
                    if line.text.startswith(tag):
                        first = [line.text]
                        break
            tg.cancel_scope.cancel()
        os.write(fd, f"{tag} b\n".encode())  # logged while the source was down
        async with aclosing(kmsg_lines(resume=resume)) as lines:
            second = [t for t in await until(lines, f"{tag} b") if t.startswith(tag)]
    finally:
        os.close(fd)
    # Every line once: none read twice, none written after the first read missing.
    assert first + second == [*written[written.index(first[0]) :], f"{tag} b"]


async def test_journal_source_restart_loses_no_line(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.touch()
    live = tmp_path / "live.jsonl"  # what arrives while the first run follows
    script = tmp_path / "journalctl.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            entries = [json.loads(l) for l in open({str(journal)!r})]
            after = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--after-cursor=")]
            if after:
                cursors = [e["__CURSOR"] for e in entries]
                shown = entries[cursors.index(after[0]) + 1:]
            else:  # -n 0: nothing from before; then what arrives live
                shown = [json.loads(l) for l in open({str(live)!r})]
                with open({str(journal)!r}, "a") as fh:
                    fh.writelines(json.dumps(e) + "\\n" for e in shown)
            for e in shown:
                print(json.dumps(e), flush=True)
            sys.exit(1)
            """
        )
    )

    def entry(n: int) -> str:
        return json.dumps({"MESSAGE": f"line {n}", "__CURSOR": f"s=x;i={n}"}) + "\n"

    live.write_text(entry(1) + entry(2))
    argv = [sys.executable, str(script)]
    resume = Resume()
    got: list[str] = []
    for _ in range(2):
        with pytest.raises(SourceDied):
            async with aclosing(journal_lines(argv, resume=resume)) as lines:
                async for line in lines:
                    got.append(line.text)
        with journal.open("a") as fh:  # logged while the source was down
            fh.write(entry(3) + entry(4))
        live.write_text("")
    assert got == ["line 1", "line 2", "line 3", "line 4"]
