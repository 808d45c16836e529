"""Both output files read as one stream, in order (store/output_merge.py), and the
header and cap records the daemon adds (store/output_files.py)."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.core.jobs import JobState
from supervisor.daemon.store import output_files as joblogs
from supervisor.daemon.store import output_merge as merge
from supervisor.keeper.output import CUT_OUT, HEADER_ERR, HEADER_OUT, RECORD, STDERR, STDOUT


def _files(tmp: Path, out: bytes, err: bytes, recs: list[tuple[int, int, int]]) -> Path:
    (tmp / "1.out").write_bytes(out)
    (tmp / "1.err").write_bytes(err)
    (tmp / "1.idx").write_bytes(b"".join(RECORD.pack(*r) for r in recs))
    return tmp / "1.out"


def _read(
    tmp: Path, position: int = 0, limit: int = 1 << 20, tail: int | None = None
) -> tuple[list[tuple[str, bytes]], int, int]:
    fds, sizes = merge.open_files({merge.OUT: tmp / "1.out", merge.ERR: tmp / "1.err"})
    try:
        lay = merge.layout((tmp / "1.idx").read_bytes(), sizes)
        if tail is not None:
            position = merge.tail_position(lay, fds, tail)
        segments, end = merge.read(lay, fds, position, limit)
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)
    return segments, end, lay.size


def test_runs_interleave_and_the_open_run_is_the_tail(tmp_path: Path) -> None:
    _files(tmp_path, b"a\nc\nopen", b"b\n", [(STDOUT, 2, 2), (STDERR, 2, 2)])
    segments, end, size = _read(tmp_path)
    assert segments == [("stdout", b"a\n"), ("stderr", b"b\n"), ("stdout", b"c\nopen")]
    assert end == size == 10


def test_a_header_shows_once_between_two_attempts(tmp_path: Path) -> None:
    head = b"\n--- gpusv: job 1, attempt 2 ---\n"
    out, err = b"o1\n" + head + b"o2\n", b"e1\n" + head + b"e2\n"
    n = len(head)
    recs = [(STDOUT, 3, 3), (STDERR, 3, 3), (HEADER_OUT, n, 3 + n), (HEADER_ERR, n, 3 + n)]
    _files(tmp_path, out, err, [*recs, (STDERR, 3, 6 + n)])
    segments, _, _ = _read(tmp_path)
    assert segments == [
        ("stdout", b"o1\n"),
        ("stderr", b"e1\n"),
        ("gpusv", head),
        ("stderr", b"e2\n"),
        ("stdout", b"o2\n"),
    ]


def test_an_attempt_from_before_the_index_reads_stdout_then_stderr(tmp_path: Path) -> None:
    head = b"\n--- h ---\n"
    n = len(head)
    _files(
        tmp_path,
        b"old out\n" + head,
        b"old err\n" + head,
        [(HEADER_OUT, n, 8 + n), (HEADER_ERR, n, 8 + n)],
    )
    segments, _, _ = _read(tmp_path)
    assert segments == [("stdout", b"old out\n"), ("stderr", b"old err\n"), ("gpusv", head)]


def test_a_record_ahead_of_its_bytes_holds_the_rest_back(tmp_path: Path) -> None:
    """The daemon records a header before it writes it: until then nothing after it."""
    _files(tmp_path, b"o\n", b"e\n", [(STDOUT, 2, 2), (HEADER_OUT, 5, 7), (HEADER_ERR, 5, 7)])
    segments, end, size = _read(tmp_path)
    assert segments == [("stdout", b"o\n")] and end == size == 2


def test_positions_hold_across_a_cut_and_reads_resume_where_they_stopped(tmp_path: Path) -> None:
    # 100 bytes were written, [10, 60) was cut (the file is 50 bytes now), then 5 more.
    before = bytes(range(65, 75)) + bytes(range(75, 115))
    recs = [(STDOUT, 100, 100), (CUT_OUT, 50, 10), (STDERR, 3, 3)]
    _files(tmp_path, before, b"e!\n", recs)
    segments, end, size = _read(tmp_path)
    assert size == 100 + 3 and end == size
    assert segments == [("stdout", before), ("stderr", b"e!\n")]
    # A reader that had read 70 bytes before the cut goes on at the same place.
    segments, end, _ = _read(tmp_path, position=70)
    assert segments == [("stdout", before[20:]), ("stderr", b"e!\n")]
    # In chunks: the cut reads as nothing, and no byte twice.
    got, at = b"", 0
    while at < size:
        segments, at = _read(tmp_path, position=at, limit=7)[:2]
        got += b"".join(data for _, data in segments)
    assert got == before + b"e!\n"


def test_tail_counts_lines_of_the_merged_stream(tmp_path: Path) -> None:
    _files(
        tmp_path,
        b"1\n3\n",
        b"2\n4\n",
        [(STDOUT, 2, 2), (STDERR, 2, 2), (STDOUT, 2, 4), (STDERR, 2, 4)],
    )
    assert _read(tmp_path, tail=2)[0] == [("stdout", b"3\n"), ("stderr", b"4\n")]
    assert _read(tmp_path, tail=3)[0] == [
        ("stderr", b"2\n"),
        ("stdout", b"3\n"),
        ("stderr", b"4\n"),
    ]
    assert _read(tmp_path, tail=0)[0] == []
    assert len(_read(tmp_path, tail=99)[0]) == 4


def test_the_daemon_records_its_header_and_the_reply_carries_segments(tmp_path: Path) -> None:
    out = _files(tmp_path, b"o\n", b"", [(STDOUT, 2, 2)])
    joblogs.write_header(out, tmp_path / "1.err", b"\n--- attempt 2 ---\n")
    reply = joblogs.merged_reply(out, 0, 1 << 20, None, JobState.RUNNING)
    assert [s["stream"] for s in reply["segments"]] == ["stdout", "gpusv"]
    assert reply["offset"] == reply["size"] and not reply["done"]
    assert joblogs.merged_reply(out, 0, 1 << 20, None, JobState.SUCCEEDED)["done"]


def test_a_job_with_no_output_yet_has_an_empty_log(tmp_path: Path) -> None:
    reply = joblogs.merged_reply(tmp_path / "9.out", 0, 1 << 20, None, JobState.RUNNING)
    assert reply["segments"] == [] and reply["size"] == 0
