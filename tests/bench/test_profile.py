"""bench.profile's reading of py-spy's folded stacks."""

from __future__ import annotations

from pathlib import Path

from bench.profile import shares


def test_samples_fall_where_their_frames_say(tmp_path: Path) -> None:
    folded = tmp_path / "daemon.folded"
    loop = "main (app.py:1);BaseEventLoop._run_once (asyncio/base_events.py:1)"
    folded.write_text(
        f"_connection_worker_thread (aiosqlite/core.py:1);_transaction (writer.py:2) 6\n"
        f"_connection_worker_thread (aiosqlite/core.py:1);execute (core.py:3) 2\n"
        f"{loop};EpollSelector.select (selectors.py:4) 1\n"
        f"{loop};Engine.do (supervisor/daemon/engine.py:5);step (core/engine.py:6) 1\n"
    )
    assert shares(folded) == {
        "SQLite thread: commit": 60.0,
        "SQLite thread: other statements": 20.0,
        "loop: epoll select (waiting, counted by py-spy)": 10.0,
        "loop: engine (claims, steps, commits)": 10.0,
    }
