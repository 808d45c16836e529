"""What the store checks before it trusts its database file, and the ids' mark: ids are
never handed out twice, even after the database lost its tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.daemon.store.commit import next_job_id
from supervisor.daemon.store.database import Store, StoreOpenError
from supervisor.daemon.store.guard import IdMark, check_database_file, newest_log_id


def test_the_newest_log_id_reads_only_job_logs(tmp_path: Path) -> None:
    assert newest_log_id(tmp_path / "missing") == 0
    assert newest_log_id(tmp_path) == 0
    for name in ("3.out", "12.err", "40.out.1", "x.out", "99.log", "7.out"):
        (tmp_path / name).write_text("")
    assert newest_log_id(tmp_path) == 12


def test_a_path_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreOpenError, match=r"dir\.db is not a regular file$"):
        check_database_file(tmp_path / "dir.db", tmp_path / "logs")
    (tmp_path / "real.db").write_text("")
    (tmp_path / "link.db").symlink_to(tmp_path / "real.db")
    with pytest.raises(StoreOpenError, match=r"link\.db is not a regular file$"):
        check_database_file(tmp_path / "link.db", tmp_path / "logs")


def test_an_empty_database_beside_older_logs_is_refused(tmp_path: Path) -> None:
    logs, db = tmp_path / "logs", tmp_path / "gpusv.db"
    check_database_file(db, logs)  # a first start: nothing there
    logs.mkdir()
    (logs / "17.out").write_text("")
    with pytest.raises(StoreOpenError) as missing:
        check_database_file(db, logs)
    assert str(missing.value) == (
        f"{db} is missing but {logs} holds logs of jobs up to 17: restore the database, "
        f"or move {logs} away to start afresh"
    )
    db.write_text("")
    with pytest.raises(StoreOpenError, match=f"^{db} is empty but"):
        check_database_file(db, logs)
    (tmp_path / "gpusv.db-wal").write_text("frames")  # its content is in the WAL
    check_database_file(db, logs)


def test_the_mark_only_rises_and_survives_a_torn_write(tmp_path: Path) -> None:
    db = tmp_path / "gpusv.db"
    mark = IdMark(db)
    assert mark.value == 0
    mark.raise_to(42)
    mark.raise_to(7)
    mark.close()
    assert (tmp_path / "gpusv.db.ids").read_text() == "00000000000000000042\n"
    again = IdMark(db)
    assert again.value == 42
    again.close()
    (tmp_path / "gpusv.db.ids").write_text("0000000000000\0\0")
    torn = IdMark(db)
    assert torn.value == 0
    torn.close()


def test_the_mark_has_a_copy_among_the_logs_that_the_logs_id_reads(tmp_path: Path) -> None:
    """A job that wrote nothing has no log: the copy marks its id among the logs."""
    db, logs = tmp_path / "gpusv.db", tmp_path / "logs"
    mark = IdMark(db, logs)
    assert (logs / "newest-id").read_text() == "00000000000000000000\n"  # its block taken
    mark.raise_to(42)
    mark.close()
    assert (logs / "newest-id").read_text() == "00000000000000000042\n"
    (tmp_path / "gpusv.db.ids").unlink()  # the state file lost: its copy still tells
    assert newest_log_id(logs) == 42
    (logs / "7.out").write_text("")
    assert newest_log_id(logs) == 42
    (logs / "newest-id").write_text("0000000\0")  # torn: the job logs still count
    assert newest_log_id(logs) == 7
    with pytest.raises(StoreOpenError, match="holds logs of jobs up to 7"):
        check_database_file(db, logs)


def test_a_logs_directory_that_refuses_the_copy_costs_nothing_but_the_copy(
    tmp_path: Path,
) -> None:
    """The copy is a fallback: a full or broken logs directory never stops a start or a
    write (the full-disk case end to end: tests/integration/test_output.py)."""
    db, logs = tmp_path / "gpusv.db", tmp_path / "logs"
    logs.write_text("not a directory")
    mark = IdMark(db, logs)
    mark.raise_to(9)
    mark.close()
    assert (tmp_path / "gpusv.db.ids").read_text() == "00000000000000000009\n"


async def test_ids_continue_after_what_the_database_lost(tmp_path: Path) -> None:
    db = tmp_path / "gpusv.db"
    store = await Store.open(db)
    assert await next_job_id(store) == 1
    await store.close()
    mark = IdMark(db)
    mark.raise_to(30)  # a tail the database lost, that the mark remembers
    mark.close()
    (tmp_path / "logs" / "45.err").write_text("")  # and a log of a later job still
    store = await Store.open(db)
    try:
        assert await next_job_id(store) == 46
        assert store.ids is not None and store.ids.value == 45
        seq = await store._all("SELECT seq FROM sqlite_sequence WHERE name='jobs'")
        assert seq == [(45,)]
    finally:
        await store.close()


async def test_a_file_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "gpusv.db"
    db.write_bytes(b"these are not the pages of a database\n" * 200)
    with pytest.raises(StoreOpenError) as refused:
        await Store.open(db)
    message = str(refused.value)
    assert message.startswith(f"{db}: ") and message.endswith(": restore it or move it away")
    assert "\n" not in message
