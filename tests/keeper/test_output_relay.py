"""The keeper's relay of jobs' output: pipes into files, the order kept in an index, and
what the disk refuses dropped and counted (supervisor/keeper/output.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from supervisor.daemon.store import output_merge as merge
from supervisor.keeper.output import RECORD, STDERR, STDOUT, Output, Relay


def _relay(tmp: Path, index: bool = True) -> tuple[Relay, Output, dict[str, int], dict[int, str]]:
    """A relay of one attempt, and the job's ends of its pipes (kept open here)."""
    relay = Relay(lambda message: None)
    out, err = tmp / "1.out", tmp / "1.err"
    output = Output((1, 1), (str(out), str(err)), str(tmp / "1.idx") if index else None, None, None)
    sink = Relay.sink(False)
    job_ends = {"stdout": os.dup(sink.out_w), "stderr": os.dup(sink.err_w)}
    reads = {sink.out_r: "stdout", sink.err_r: "stderr"}
    relay.start(output, sink)
    return relay, output, job_ends, reads


def _say(relay: Relay, output: Output, ends: dict[str, int], stream: str, data: bytes) -> None:
    """The job writes, and the keeper's loop finds that pipe readable."""
    os.write(ends[stream], data)
    fd = next(
        fd for fd, name in output.open_pipes.items() if name == (1 if stream == "stdout" else 2)
    )
    relay.readable(output, fd)


def _merged(tmp: Path) -> list[tuple[str, bytes]]:
    fds, sizes = merge.open_files({merge.OUT: tmp / "1.out", merge.ERR: tmp / "1.err"})
    index = (tmp / "1.idx").read_bytes() if (tmp / "1.idx").exists() else b""
    segments, _ = merge.read(merge.layout(index, sizes), fds, 0, 1 << 20)
    for fd in fds.values():
        if fd >= 0:
            os.close(fd)
    return segments


def test_two_streams_are_copied_and_their_order_recorded_once_per_switch(tmp_path: Path) -> None:
    relay, output, ends, _ = _relay(tmp_path)
    for stream, data in [
        ("stdout", b"a\n"),
        ("stdout", b"a2\n"),
        ("stderr", b"b\n"),
        ("stdout", b"c\n"),
    ]:
        _say(relay, output, ends, stream, data)
    assert relay.ended((1, 1)) == 0
    assert (tmp_path / "1.out").read_bytes() == b"a\na2\nc\n"
    assert (tmp_path / "1.err").read_bytes() == b"b\n"
    index = (tmp_path / "1.idx").read_bytes()
    recs = [RECORD.unpack_from(index, i) for i in range(0, len(index), RECORD.size)]
    assert recs == [(STDOUT, 5, 5), (STDERR, 2, 2), (STDOUT, 2, 7)]  # kind, bytes, end
    assert _merged(tmp_path) == [("stdout", b"a\na2\n"), ("stderr", b"b\n"), ("stdout", b"c\n")]


def test_eof_of_both_pipes_closes_everything_and_the_count_outlives_it(tmp_path: Path) -> None:
    relay, output, ends, reads = _relay(tmp_path)
    _say(relay, output, ends, "stderr", b"x")
    for fd in ends.values():
        os.close(fd)
    for fd in list(reads):
        relay.readable(output, fd)
    assert output.open_pipes == {} and output.files == {}
    assert (1, 1) in relay.outputs  # its exit has not taken the count yet
    assert relay.ended((1, 1)) == 0
    assert relay.outputs == {}


def test_a_disk_that_refuses_costs_bytes_counted_and_a_mark_where_they_went(
    tmp_path: Path,
) -> None:
    relay, output, ends, _ = _relay(tmp_path)
    _say(relay, output, ends, "stdout", b"kept\n")

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    relay.write = full
    _say(relay, output, ends, "stdout", b"0123456789")
    _say(relay, output, ends, "stderr", b"lost too\n")
    assert output.dropped == 10 + 9
    relay.write = os.write
    _say(relay, output, ends, "stdout", b"back\n")
    text = (tmp_path / "1.out").read_bytes()
    assert text.startswith(b"kept\n") and text.endswith(b"back\n")
    assert b"output dropped here (19 bytes so far)" in text
    assert relay.ended((1, 1)) == 19


def test_without_an_index_the_files_are_still_written(tmp_path: Path) -> None:
    relay, output, ends, _ = _relay(tmp_path, index=False)
    _say(relay, output, ends, "stdout", b"o\n")
    _say(relay, output, ends, "stderr", b"e\n")
    relay.ended((1, 1))
    assert not (tmp_path / "1.idx").exists()
    assert _merged(tmp_path) == [("stdout", b"o\n"), ("stderr", b"e\n")]  # stdout, then stderr
