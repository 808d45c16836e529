"""Keepers are watched: a ping unanswered past the limit makes a keeper "not answering"
(said once, its card blocked), anything heard undoes it; an end gpusvd recorded itself
is only acknowledged when the keeper's own comes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from supervisor.daemon.running import keepers
from supervisor.daemon.running.handles import ended_by_gpusvd, exit_status
from supervisor.daemon.running.keeper_watch import KeeperWatch, card_of, silent
from supervisor.keeper.journal import Record

from .transport import Transport


def _keeper(name: str) -> tuple[keepers.Keeper, Transport]:
    keeper = keepers.wired(name, Path("/nonexistent"))
    t = Transport()
    keeper.wire.connection_made(t)
    keeper.pid = 4242
    return keeper, t


def _ops(t: Transport) -> list[str]:
    return [json.loads(line)["op"] for line in t.sent]


def test_silence_is_a_ping_unanswered_for_the_whole_limit() -> None:
    assert not silent(None, 100.0, 5.0)
    assert not silent(96.0, 100.0, 5.0)
    assert silent(95.0, 100.0, 5.0)


def test_a_keeper_serves_the_card_its_name_says() -> None:
    assert card_of("gpu3") == 3 and card_of("gpu12") == 12
    assert card_of("cpu") is None


async def test_a_keeper_that_does_not_answer_is_found_said_and_let_go_when_it_answers() -> None:
    gpu1, t1 = _keeper("gpu1")
    cpu, _ = _keeper("cpu")
    changes: list[set[int]] = []
    watch = KeeperWatch(
        lambda: {"gpu1": gpu1, "cpu": cpu},
        silent_after_s=5.0,
        on_change=lambda: changes.append(watch.blocked_cards()),
    )

    def check(now: float) -> None:  # the CPU keeper answers every ping at once
        watch.check(now)
        cpu.wire.data_received(b'{"id": 1, "ok": true}\n')

    check(100.0)
    assert _ops(t1) == ["ping"]
    check(101.0)
    check(104.9)
    assert _ops(t1) == ["ping"] and changes == []  # one question at a time
    check(105.0)
    assert changes == [{1}] and watch.not_answering().keys() == {"gpu1"}
    assert watch.blocked() == {"gpu1"}
    (problem,) = watch.problems(106.0)
    assert problem.startswith("keeper gpu1 (pid 4242) not answering for 6s")
    check(106.0)
    assert changes == [{1}]  # said once
    gpu1.wire.data_received(b'{"id": 1, "ok": true}\n')  # SIGCONT: it answers
    check(107.0)
    assert changes == [{1}, set()] and watch.problems(107.0) == []


async def test_a_keeper_that_died_is_not_counted_silent() -> None:
    cpu, _ = _keeper("cpu")
    watch = KeeperWatch(lambda: {"cpu": cpu}, silent_after_s=2.0)
    watch.check(0.0)
    watch.check(2.0)
    assert watch.blocked() == {"cpu"}
    assert watch.problems(2.0) == [
        "keeper cpu (pid 4242) not answering for 2s: CPU jobs sent to it wait until it answers"
    ]
    cpu.gone = True
    watch.check(3.0)
    assert watch.blocked() == set() and cpu.silent_since is None


async def test_an_end_recorded_by_gpusvd_is_only_acknowledged_when_the_keeper_sends_its_own() -> (
    None
):
    keeper, t = _keeper("gpu0")
    started = Record(7, 1, 1234, 99, 1000.0, "/sys/fs/cgroup/unified/x/job-7-1")
    ended = ended_by_gpusvd(started, 1010.0)
    status = exit_status(ended)
    assert status is not None and status.signal == signal.SIGKILL
    keeper.settle(ended)
    assert await keeper.ended((7, 1)) == ended
    assert (7, 1) in keeper.settled
    real = {**started.to_json(), "ended_at": 1011.0, "wait_status": 0, "exit_code": 0}
    keeper.wire.data_received(json.dumps({"event": "exit", "job": real}).encode() + b"\n")
    assert _ops(t) == ["ack"] and json.loads(t.sent[0])["job"] == 7
    assert "id" not in json.loads(t.sent[0])  # nobody waits for its answer: none comes
    assert keeper.settled == set() and (7, 1) not in keeper._ended


def test_keepers_say_who_does_not_answer_and_whose_jobs_lack_a_cgroup(tmp_path: Path) -> None:
    ks = keepers.Keepers(tmp_path)
    assert ks.state("gpu0") is None and ks.problems(0.0) == []
    gpu0, _ = _keeper("gpu0")
    ks.keepers["gpu0"] = gpu0
    assert ks.state("gpu0") == "ok"
    gpu0.asked, gpu0.silent_since = 10.0, 15.0
    assert ks.state("gpu0") == "not answering" and not ks.can("gpu0", "after")
    ks.cgroup_trouble["gpu0"] = "cannot make cgroup /x/job-1-1: Resource temporarily unavailable"
    assert ks.problems(16.0) == [
        "keeper gpu0 (pid 4242) not answering for 6s: its card takes no new jobs",
        "keeper gpu0: jobs not started: cannot make cgroup /x/job-1-1: Resource temporarily "
        "unavailable",
    ]
    gpu0.gone = True
    assert ks.state("gpu0") is None
