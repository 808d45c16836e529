"""The line held back behind a job: what a hang of its card drops before it is killed."""

from __future__ import annotations

from supervisor.daemon.running.ahead import Ahead, behind


def test_the_line_behind_a_job_is_what_follows_it_and_what_follows_those() -> None:
    aheads = {2: Ahead((1, 1)), 5: Ahead((4, 1)), 3: Ahead((2, 1)), 6: Ahead((3, 1))}
    assert behind(aheads, 1) == [aheads[2], aheads[3], aheads[6]]
    assert behind(aheads, 4) == [aheads[5]]
    assert behind(aheads, 3) == [aheads[6]]
    assert behind(aheads, 6) == []
