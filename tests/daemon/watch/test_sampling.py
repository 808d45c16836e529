"""The sampler's pure helpers: when an attempt has run past its wall-time limit, and
how much of a job's new output one pass scans for its progress regex."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.daemon.watch.sampling import READ_LIMIT, _read, past_limit

STARTED = "2026-01-02T03:00:00.000Z"  # 1767322800.0
EPOCH = 1767322800.0


@pytest.mark.parametrize(
    ("now", "limit_s", "past"),
    [
        (EPOCH + 59.9, 60.0, False),
        (EPOCH + 60.0, 60.0, False),  # exactly at the limit: not yet past it
        (EPOCH + 60.001, 60.0, True),
        (EPOCH + 3600, 60.0, True),
        (EPOCH - 5, 0.0, False),  # a clock that stepped back
        (EPOCH + 0.5, 0.0, True),
    ],
)
def test_past_limit(now: float, limit_s: float, past: bool) -> None:
    assert past_limit(STARTED, limit_s, now) is past


def test_past_limit_reads_the_stamp_s_milliseconds() -> None:
    assert past_limit("2026-01-02T03:00:00.500Z", 10.0, EPOCH + 10.4) is False
    assert past_limit("2026-01-02T03:00:00.500Z", 10.0, EPOCH + 10.6) is True


def test_new_output_is_read_between_the_offsets(tmp_path: Path) -> None:
    path = tmp_path / "1.out"
    path.write_bytes(b"epoch 1\nepoch 2\nepoch 3\n")
    assert _read(path, 8, 16) == "epoch 2\n"
    assert _read(path, 0, 24) == "epoch 1\nepoch 2\nepoch 3\n"


def test_a_pass_reads_at_most_the_last_read_limit_before_its_end(tmp_path: Path) -> None:
    path = tmp_path / "1.out"
    end = 2 * READ_LIMIT
    # The log has grown past `end` since it was measured: that part is the next pass's.
    path.write_bytes(b"a" * (end - READ_LIMIT) + b"b" * READ_LIMIT + b"c" * READ_LIMIT)
    text = _read(path, 0, end)
    assert text == "b" * READ_LIMIT


def test_undecodable_output_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "1.err"
    path.write_bytes(b"step \xff\xfe 4\n")
    assert _read(path, 0, 10) == "step \ufffd\ufffd 4\n"
