"""The journal's lines carry a length and a checksum: a torn last line is cut quietly,
damage in the middle is said and flagged, a journal of the older format still replays,
and an exit the disk refuses is kept in memory until the disk takes it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.keeper import cgroup
from supervisor.keeper.jobs import Jobs
from supervisor.keeper.journal import Journal, Record, frame, unframe
from supervisor.keeper.takeover import take_over


def _record(job: int) -> Record:
    return Record(job, 1, 1000 + job, 500 + job, 1.0, f"/cg/job-{job}-1", None)


def _exit(journal: Journal, job: int, code: int) -> None:
    record = journal.records[(job, 1)]
    journal.append("exit", record, ended_at=2.0, exit_code=code, wait_status=code << 8)


def test_each_line_has_its_length_and_checksum_and_replays(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    journal.append("start", _record(1))
    _exit(journal, 1, 3)
    journal.close()
    lines = (tmp_path / "journal").read_bytes().splitlines()
    assert all(line.startswith(b"#") for line in lines)
    assert unframe(lines[1])["exit_code"] == 3
    assert Journal(tmp_path / "journal").records[(1, 1)].exit_code == 3


def test_a_journal_of_the_older_format_replays_and_takes_new_lines(tmp_path: Path) -> None:
    """A job running across an upgrade: its start was written by the older keeper."""
    old = {"e": "start", **_record(1).to_json()}
    del old["damaged"]  # the older record had no such field
    ended = {"e": "start", **_record(2).to_json()}
    done = {"e": "exit", "job": 2, "attempt": 1, "ended_at": 2.0, "exit_code": 0}
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in (old, ended, done))
    (tmp_path / "journal").write_text(text)
    journal = Journal(tmp_path / "journal")
    assert not journal.damaged
    assert not journal.records[(1, 1)].ended and journal.records[(2, 1)].exit_code == 0
    _exit(journal, 1, 7)  # the new keeper ends it in the new format
    journal.close()
    again = Journal(tmp_path / "journal")
    assert again.records[(1, 1)].exit_code == 7 and not again.damaged


def test_a_torn_last_line_is_cut_quietly(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal")
    journal.append("start", _record(1))
    journal.close()
    with open(tmp_path / "journal", "ab") as fh:
        fh.write(frame({"e": "exit", "job": 1, "attempt": 1, "ended_at": 3.0})[:-9])
    again = Journal(tmp_path / "journal")
    assert not again.damaged and not again.records[(1, 1)].ended


def test_a_damaged_exit_in_the_middle_is_said_and_its_record_flagged_not_silently_lost(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    journal = Journal(tmp_path / "journal")
    for job in (1, 2):
        journal.append("start", _record(job))
    _exit(journal, 1, 3)
    _exit(journal, 2, 4)
    journal.close()
    data = (tmp_path / "journal").read_bytes()
    at = data.index(b'"exit_code":3')  # one byte of job 1's exit changes: 3 -> 5
    (tmp_path / "journal").write_bytes(data[:at] + b'"exit_code":5' + data[at + 13 :])
    again = Journal(tmp_path / "journal", log=said.append)
    assert len(again.damaged) == 1 and "job (1, 1)" in again.damaged[0]
    assert any("DAMAGED" in line for line in said)
    assert again.records[(1, 1)].damaged and not again.records[(1, 1)].ended
    assert again.records[(2, 1)].exit_code == 4 and not again.records[(2, 1)].damaged
    jobs = Jobs(again, cgroup.Roots(), said.append)
    take_over(jobs)  # it is then taken as lost, and says why, on the record and in the log
    record = again.records[(1, 1)]
    assert record.lost and record.damaged and "journal damaged" in (record.error or "")
    assert any("could not be read (damaged)" in line for line in said)


def test_a_failed_write_that_cannot_be_cut_off_never_glues_the_next_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "journal")
    journal.append("start", _record(1))
    real_write = os.write

    def half(fd: int, data: bytes) -> int:
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.EIO, "I/O error")

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "write", half)
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    with pytest.raises(OSError):
        journal.append("start", _record(2))
    monkeypatch.setattr(os, "write", real_write)  # the disk writes again; still no cut
    _exit(journal, 1, 9)
    monkeypatch.undo()
    journal.close()
    again = Journal(tmp_path / "journal")
    assert again.records[(1, 1)].exit_code == 9  # the exit after the part stands whole
    assert (2, 1) not in again.records and len(again.damaged) == 1


@contextlib.contextmanager
def small_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Fill the filesystem up: the next write of any size fails ENOSPC."""
    ballast = where / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        while True:  # down to the last byte a block short write may leave
            try:
                os.write(fd, b"\0")
            except OSError:
                break
    finally:
        os.close(fd)
    return ballast


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_an_exit_the_full_disk_refuses_is_kept_in_memory_and_written_once_it_can_be(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        said: list[str] = []
        journal = Journal(disk / "journal", log=said.append)
        journal.append("start", _record(1))
        journal.sync()
        ballast = fill(disk)
        with pytest.raises(OSError):  # the journal's last page, then nothing: full
            for job in range(100, 200):
                journal.append("start", _record(job))
        _exit(journal, 1, 3)  # refused by the disk: kept, in order, never raised
        journal.append("ack", journal.records[(1, 1)])
        assert journal.pending and (1, 1) not in journal.records
        assert journal.sync() is False and journal.pending
        with pytest.raises(OSError):  # a start, though, is refused: its job never runs
            journal.append("start", _record(2))
        assert (2, 1) not in journal.records
        ballast.unlink()
        assert journal.sync() is True and not journal.pending
        journal.close()
        replay = Journal(disk / "journal")
        assert (1, 1) not in replay.records and not replay.damaged  # exit, then ack
        assert (2, 1) not in replay.records


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_compaction_on_a_full_disk_keeps_the_old_file_whole(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        said: list[str] = []
        journal = Journal(disk / "journal", log=said.append)
        journal.append("start", _record(1))
        journal.sync()
        fill(disk)
        assert journal.compact() is False
        assert not (disk / "journal.tmp").exists() and any("compact" in s for s in said)
        assert sorted(Journal(disk / "journal").records) == [(1, 1)]
