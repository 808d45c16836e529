"""A gated start answered before its exec (keeper/server.py, EXEC_ANSWER_S) that never
exec'd ends `spawn_failed` with its keeper's reason; no other end is taken for one."""

from __future__ import annotations

from dataclasses import replace

from supervisor.daemon.running.handles import never_ran
from supervisor.keeper.journal import Record

STARTED = Record(7, 1, pid=4242, start_ticks=0, started_at=1.0)
REFUSED = "cannot enter working directory /home/u/run: missing or not permitted"


def test_the_reason_its_keeper_recorded_is_the_spawn_error() -> None:
    ended = replace(STARTED, ended_at=2.0, wait_status=127 << 8, exit_code=127, error=REFUSED)
    assert never_ran(ended) == REFUSED


def test_an_ordinary_end_or_a_lost_one_is_not_taken_for_a_start_that_never_ran() -> None:
    assert never_ran(None) is None
    assert never_ran(replace(STARTED, ended_at=2.0, wait_status=127 << 8, exit_code=127)) is None
    damaged = "journal damaged: an exit of this attempt may have been lost"
    assert never_ran(replace(STARTED, ended_at=2.0, lost=True, error=damaged)) is None
