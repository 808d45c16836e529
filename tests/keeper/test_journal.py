"""The keeper's journal on a real file: replay, a torn last line, compaction, syncs."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from supervisor.keeper.journal import Journal, Record


def _record(job: int) -> Record:
    return Record(job, 1, 1000 + job, 500 + job, 1.0, f"/cg/job-{job}-1", None)


def test_replay_gives_back_starts_exits_and_forgets_acknowledged(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    for job in (1, 2, 3):
        journal.append("start", _record(job))
    journal.append("exit", journal.records[(2, 1)], ended_at=2.0, exit_code=3, wait_status=768)
    journal.append("exit", journal.records[(3, 1)], ended_at=2.0, exit_code=0, wait_status=0)
    journal.append("ack", journal.records[(3, 1)])
    journal.close()
    again = Journal(tmp_path / "journal").records
    assert sorted(again) == [(1, 1), (2, 1)]
    assert not again[(1, 1)].ended and again[(1, 1)].cgroup == "/cg/job-1-1"
    assert again[(2, 1)].exit_code == 3 and again[(2, 1)].ended


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    journal.append("start", _record(1))
    journal.close()
    with open(tmp_path / "journal", "ab") as fh:
        fh.write(b'{"e":"exit","job":1,"attempt":1,"ended_at":3.0,"exit_c')
    again = Journal(tmp_path / "journal")
    assert not again.records[(1, 1)].ended
    again.append("exit", again.records[(1, 1)], ended_at=3.0, exit_code=1)
    again.close()  # a line appended after the torn one still counts
    assert Journal(tmp_path / "journal").records[(1, 1)].exit_code == 1


def test_compaction_keeps_only_live_records(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", compact_after=50)
    for job in range(100):
        record = _record(job)
        journal.append("start", record)
        journal.append("exit", record, ended_at=2.0, exit_code=0)
        if job != 42:
            journal.append("ack", record)
        journal.sync()
    assert journal.lines < 50
    journal.append("start", _record(100))
    journal.close()
    assert sorted(Journal(tmp_path / "journal").records) == [(42, 1), (100, 1)]
    assert not (tmp_path / "journal.tmp").exists()


def test_a_start_is_written_at_once_and_only_exits_ask_for_a_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start must be in the file (the page cache) before its job may run, not on disk:
    it needs no fdatasync of its own and reaches the disk with the next one. Nor does an
    ack: an ack lost to a power cut leaves an ended record, acknowledged again by the next
    gpusvd, which committed its end before it sent the ack."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", synced.append)
    journal = Journal(tmp_path / "journal")
    journal.append("start", _record(1))
    assert b'"e":"start","job":1,"attempt":1,"pid":1001' in (tmp_path / "journal").read_bytes()
    journal.sync()
    assert synced == []
    journal.append("start", _record(2))
    journal.append("exit", journal.records[(1, 1)], ended_at=2.0, exit_code=0)
    journal.sync()  # one sync for the turn, the start before it included
    assert len(synced) == 1
    journal.append("ack", journal.records[(1, 1)])
    journal.sync()
    assert len(synced) == 1  # written, in the file, not synced
    assert sorted(Journal(tmp_path / "journal").records) == [(2, 1)]
    journal.append("exit", journal.records[(2, 1)], ended_at=3.0, exit_code=0)
    journal.sync()  # the next exit's sync carries the ack along
    assert len(synced) == 2


def test_a_line_that_cannot_be_written_whole_is_cut_off_and_not_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "journal")
    journal.append("start", _record(1))
    before = (tmp_path / "journal").read_bytes()
    real_write = os.write
    calls: list[int] = []

    def half_then_full(fd: int, data: bytes) -> int:  # a short write, then a full disk
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        journal.append("start", _record(2))
    monkeypatch.undo()
    assert len(calls) == 2  # the rest of a short write was tried, not dropped
    assert (tmp_path / "journal").read_bytes() == before
    assert sorted(journal.records) == [(1, 1)]
    journal.append("start", _record(3))  # the next line starts a line of its own
    journal.close()
    assert sorted(Journal(tmp_path / "journal").records) == [(1, 1), (3, 1)]
