"""The OOM ranking kept as jobs start and end, on real processes: after every start and
every end, the newest dispatched job's process reads 1000 in /proc and every other one
the base value, as ranking them all again would have it, and a start writes no job but
the two whose value changes."""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from typing import Any, cast

from supervisor.core import oom as ranking
from supervisor.daemon.running import oom_scores as oom
from supervisor.daemon.running.oom_rank import OomRank
from supervisor.daemon.running.procs import Proc

BASE = ranking.base_value(oom.read_value() or 0)


@dataclass
class Tree:
    """What the ranking reads of a kept process: its pids (here one real process)."""

    pid: int
    reads: int = 0
    ended: object = None  # its keeper's exit record, once read

    def pids_now(self) -> list[int]:
        self.reads += 1
        return [self.pid]


def _proc(job_id: int, seq: int, pid: int) -> Proc:
    p = Proc(job_id, 1, (0,), seq, 0.0, cast(Any, Tree(pid)))
    oom.apply({pid: ranking.NEWEST})  # as its keeper sets it before exec
    p.oom_score_adj = ranking.NEWEST
    return p


def _expected(procs: dict[int, Proc]) -> dict[int, int]:
    newest = ranking.newest_job({p.job_id: p.seq for p in procs.values()})
    return {j: ranking.NEWEST if j == newest else BASE for j in procs}


def _read(procs: dict[int, Proc]) -> dict[int, int | None]:
    return {j: oom.read_value(cast(Tree, p.handle).pid) for j, p in procs.items()}


def test_a_start_lowers_the_newest_before_it_or_itself_and_reads_no_other_job(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    procs: dict[int, Proc] = {}
    rank = OomRank(procs, BASE)
    for job_id, seq in ((1, 100), (2, 110), (3, 120)):
        procs[job_id] = _proc(job_id, seq, sleepers[job_id].pid)
        rank.started(procs[job_id])
        assert _read(procs) == _expected(procs)
    assert [cast(Tree, procs[j].handle).reads for j in (1, 2, 3)] == [1, 1, 0]
    # Dispatched before job 3 but started after it (another card's line): it is older.
    procs[4] = _proc(4, 115, sleepers[4].pid)
    rank.started(procs[4])
    assert _read(procs) == _expected(procs) and _read(procs)[4] == BASE
    assert cast(Tree, procs[3].handle).reads == 0  # job 3 stays newest, unwritten


def test_a_job_whose_leader_ended_is_not_read_nor_written(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """A job started behind another on its card: the one in front has exited (its
    keeper started this one after), and what is left of its tree is killed at its end."""
    procs: dict[int, Proc] = {}
    rank = OomRank(procs, BASE)
    procs[1] = _proc(1, 1, sleepers[1].pid)
    rank.started(procs[1])
    procs[1].leader_ended = True
    procs[2] = _proc(2, 2, sleepers[2].pid)
    rank.started(procs[2])
    assert cast(Tree, procs[1].handle).reads == 0 and procs[1].oom_score_adj == BASE
    assert _read(procs) == {1: ranking.NEWEST, 2: ranking.NEWEST}  # 1's rank left as it was
    cast(Tree, procs[2].handle).ended = object()  # its exit record came before the next start
    procs[3] = _proc(3, 3, sleepers[3].pid)
    rank.started(procs[3])
    assert cast(Tree, procs[2].handle).reads == 0 and procs[2].oom_score_adj == BASE


def test_the_end_of_the_newest_promotes_the_next_and_an_older_end_changes_nothing(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    procs: dict[int, Proc] = {}
    rank = OomRank(procs, BASE)
    for job_id in (1, 2, 3):
        procs[job_id] = _proc(job_id, job_id, sleepers[job_id].pid)
        rank.started(procs[job_id])
    del procs[1]
    rank.ended(1)
    assert _read(procs) == {2: BASE, 3: ranking.NEWEST}
    del procs[3]
    rank.ended(3)
    assert _read(procs) == {2: ranking.NEWEST}


def test_after_a_take_back_the_next_start_or_end_ranks_every_job(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    procs: dict[int, Proc] = {}
    rank = OomRank(procs, BASE)
    for job_id in (1, 2, 3):  # taken back: values as an earlier daemon left them
        procs[job_id] = _proc(job_id, job_id, sleepers[job_id].pid)
        procs[job_id].oom_score_adj = None
    rank.known = False
    del procs[2]  # an older job's end, while what is newest is not known here
    rank.ended(2)
    assert _read(procs) == {1: BASE, 3: ranking.NEWEST}
    procs[4] = _proc(4, 4, sleepers[4].pid)
    rank.started(procs[4])
    assert _read(procs) == {1: BASE, 3: BASE, 4: ranking.NEWEST}


def test_any_order_of_starts_and_ends_ranks_as_ranking_all_again_would(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    rng = random.Random(7)
    procs: dict[int, Proc] = {}
    rank = OomRank(procs, BASE)
    free = [p.pid for p in sleepers]
    next_id = 1
    for _ in range(200):
        if free and (not procs or rng.random() < 0.55):
            seq = next_id * 10 + rng.choice((0, 0, -35))  # now and then, one dispatched earlier
            p = _proc(next_id, seq, free.pop())
            procs[next_id] = p
            next_id += 1
            rank.started(p)
        else:
            job_id = rng.choice(sorted(procs))
            free.append(cast(Tree, procs.pop(job_id).handle).pid)
            rank.ended(job_id)
        assert _read(procs) == _expected(procs)
