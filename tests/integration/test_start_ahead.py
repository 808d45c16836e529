"""Starting ahead, end to end: behind a short kind of job, the next job of its card or
CPU slot is claimed while it runs and its keeper starts it the moment it exits; that job
says `starting` meanwhile, can be cancelled without ever running, and never runs after
a daemon that died, a drain or a hang of its card let it go."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from supervisor.daemon.config import JobsConfig

from .conftest import Daemon
from .test_gpu_hangs import XID_109_CARD0

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]

KEY = "ahead-kind"
AHEAD = "cpu_slots = 1\n[jobs]\nstart_ahead_s = 60\nstart_ahead_depth = 2\n"
GATED = "while [ ! -e go ]; do sleep 0.01; done"  # runs until the test creates ./go


def short_kind(d: Daemon, gpus: int) -> None:
    """One quick success of the kind: from now on it counts as short."""
    d.wait_done(d.submit("true", mem_key=KEY, gpus=gpus))


def gated_then_behind(d: Daemon, gpus: int) -> tuple[int, int]:
    """A running job of the short kind that waits for ./go, and a job claimed behind it
    (which writes ./b when it runs)."""
    short_kind(d, gpus)
    first = d.submit("sh", "-c", GATED, mem_key=KEY, gpus=gpus)
    d.wait_pid(first)
    second = d.submit("sh", "-c", "echo ran >> b", mem_key=KEY, gpus=gpus)
    d.wait_for(lambda: d.show(second)["starting"], what="the second job claimed ahead")
    return first, second


def attempts(d: Daemon, job: int) -> list[dict[str, Any]]:
    return list(d.show(job)["attempts"])


@pytest.mark.parametrize("gpus", [1, 0], ids=["card", "cpu-slot"])
def test_the_next_job_waits_claimed_and_starts_when_the_one_before_it_exits(
    make_daemon: Callable[..., Daemon], gpus: int
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second = gated_then_behind(d, gpus)
    shown = d.show(second)
    assert shown["state"] == "running" and shown["attempts"][0]["pid"] is None
    assert any("starting once job" in e["message"] for e in shown["events"])
    (row,) = [r for r in d.cli("list").stdout.splitlines()[1:] if r.split()[0] == str(second)]
    assert row.split()[1] == "starting"
    if gpus:
        (card,) = json.loads(d.cli("gpus", "--json").stdout)
        assert card["running_jobs"] == [first]  # the card is not the second job's yet
    assert not (d.root / "b").exists() and d.show(first)["state"] == "running"
    (d.root / "go").touch()
    done_first, done_second = d.wait_done(first), d.wait_done(second)
    assert (done_first["state"], done_second["state"]) == ("succeeded", "succeeded")
    (a,), (b,) = done_first["attempts"], done_second["attempts"]
    assert b["started_at"] >= a["ended_at"]  # its start, not its claim
    assert done_second["started_at"] == b["started_at"] and not done_second["starting"]
    assert (d.root / "b").read_text() == "ran\n"


def test_a_long_kind_is_not_followed_the_next_job_waits_queued(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config="[jobs]\nstart_ahead_s = 0.2\n")
    d.wait_done(d.submit("sleep", "0.5", mem_key=KEY))  # succeeded, but took longer
    first = d.submit("sh", "-c", GATED, mem_key=KEY)
    d.wait_pid(first)
    second = d.submit("true", mem_key=KEY)
    held = d.wait_for(lambda: (j := d.show(second))["waiting_for"] and j, what="a hold")
    assert held["state"] == "queued" and not held["starting"]
    (d.root / "go").touch()
    assert d.wait_done(second)["state"] == "succeeded"


def test_cancelling_a_job_claimed_ahead_ends_it_at_once_and_it_never_runs(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second = gated_then_behind(d, 1)
    d.cli("cancel", str(second))
    done = d.wait_done(second)  # while the one before it still runs
    assert done["state"] == "cancelled" and d.show(first)["state"] == "running"
    assert [a["pid"] for a in done["attempts"]] == [None]
    (d.root / "go").touch()
    assert d.wait_done(first)["state"] == "succeeded"
    assert not (d.root / "b").exists()


def test_a_daemon_killed_while_a_job_waits_claimed_ahead_queues_it_again_after_restart(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second = gated_then_behind(d, 1)
    pid = d.wait_pid(first)
    d.kill9()
    d.start()  # its attach closes the old connection: the keeper drops the held spawn
    assert d.wait_pid(first) == pid  # taken back
    (d.root / "go").touch()
    assert d.wait_done(first)["state"] == "succeeded"
    done = d.wait_done(second)
    assert done["state"] == "succeeded"
    # Its claim never started: released with no attempt row, so it ran once, as attempt 1.
    assert [(a["n"], a["reason"]) for a in done["attempts"]] == [(1, None)]
    assert done["attempts"][0]["pid"] is not None
    assert "requeued" in [e["kind"] for e in done["events"]]
    assert done["retries"]["ordinary"]["used"] == 0
    assert (d.root / "b").read_text() == "ran\n"


def test_a_drain_lets_a_job_claimed_ahead_go_without_running_it(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second = gated_then_behind(d, 1)
    assert d.stop() == 0
    assert not (d.root / "b").exists()
    d.start()
    (d.root / "go").touch()
    assert d.wait_done(first)["state"] == "succeeded"
    done = d.wait_done(second)
    assert done["state"] == "succeeded" and done["attempts"][0]["reason"] == "interrupted"
    assert (d.root / "b").read_text() == "ran\n"


def test_a_hang_of_its_card_puts_a_job_claimed_ahead_back_in_the_queue(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second = gated_then_behind(d, 1)
    d.append_kernel(XID_109_CARD0)
    hung = d.wait_for(
        lambda: (a := attempts(d, first)) and a[0]["reason"] == "gpu_hang" and a, what="hang"
    )
    assert hung[0]["reason"] == "gpu_hang"
    behind = d.wait_for(lambda: (a := attempts(d, second)) and a[0]["reason"] and a, what="its end")
    assert behind[0]["reason"] == "interrupted" and behind[0]["pid"] is None
    (d.root / "go").touch()
    assert d.wait_done(first, timeout=60)["state"] == "succeeded"
    done = d.wait_done(second, timeout=60)
    assert done["state"] == "succeeded"
    assert (done["retries"]["ordinary"]["used"], done["retries"]["gpu_hang"]["used"]) == (0, 0)


def test_a_job_claimed_ahead_of_one_that_runs_long_goes_back_to_the_queue(
    make_daemon: Callable[..., Daemon],
) -> None:
    """Its kind ran short before, this run does not: past twice `start_ahead_s` the job
    behind it is let go, so that it is not bound to that card for however long it runs."""
    d = make_daemon(gpus="1x8G", config="[jobs]\nstart_ahead_s = 1.5\n")
    first, second = gated_then_behind(d, 1)
    released = d.wait_for(
        lambda: (a := attempts(d, second)) and a[0]["reason"] and a, what="its release"
    )
    assert released[0]["reason"] == "interrupted" and released[0]["pid"] is None
    assert "ran past 3 s" in json.dumps(released[0]["evidence"])
    held = d.wait_for(lambda: (j := d.show(second))["waiting_for"] and j, what="a hold")
    assert held["state"] == "queued" and d.show(first)["state"] == "running"
    (d.root / "go").touch()
    done = d.wait_done(second)
    assert done["state"] == "succeeded" and done["retries"]["ordinary"]["used"] == 0
    assert (d.root / "b").read_text() == "ran\n"


def test_a_pause_puts_a_job_claimed_ahead_back_in_the_queue(
    make_daemon: Callable[..., Daemon],
) -> None:
    """No new job starts while paused, not even one already lined up behind another."""
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second = gated_then_behind(d, 1)
    d.cli("pause")
    released = d.wait_for(
        lambda: (a := attempts(d, second)) and a[0]["reason"] and a, what="its release"
    )
    assert [(a["reason"], a["pid"]) for a in released] == [("interrupted", None)]
    (d.root / "go").touch()
    assert d.wait_done(first)["state"] == "succeeded"
    assert d.show(second)["state"] == "queued" and not (d.root / "b").exists()
    d.cli("resume")
    assert d.wait_done(second)["state"] == "succeeded"
    assert (d.root / "b").read_text() == "ran\n"


def gated_then_chain(d: Daemon, gpus: int) -> tuple[int, int, int]:
    """As gated_then_behind, and a third job (it writes ./c) claimed behind the second:
    two wait, one behind the other (`start_ahead_depth` = 2 in AHEAD)."""
    first, second = gated_then_behind(d, gpus)
    third = d.submit("sh", "-c", "echo ran >> c", mem_key=KEY, gpus=gpus)
    d.wait_for(lambda: d.show(third)["starting"], what="the third job claimed ahead")
    return first, second, third


@pytest.mark.parametrize("gpus", [1, 0], ids=["card", "cpu-slot"])
def test_two_jobs_wait_one_behind_the_other_and_start_in_turn(
    make_daemon: Callable[..., Daemon], gpus: int
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second, third = gated_then_chain(d, gpus)
    assert "starting once job 2" in json.dumps(d.show(third)["events"]).replace(str(second), "2")
    fourth = d.submit("true", mem_key=KEY, gpus=gpus)  # no deeper than two
    held = d.wait_for(lambda: (j := d.show(fourth))["waiting_for"] and j, what="a hold")
    assert held["state"] == "queued" and not held["starting"]
    assert not (d.root / "b").exists() and not (d.root / "c").exists()
    (d.root / "go").touch()
    done = [d.wait_done(j) for j in (first, second, third, fourth)]
    assert [j["state"] for j in done] == ["succeeded"] * 4
    ends = [j["attempts"][0] for j in done[:3]]
    assert ends[1]["started_at"] >= ends[0]["ended_at"]
    assert ends[2]["started_at"] >= ends[1]["ended_at"]
    assert (d.root / "b").read_text() == (d.root / "c").read_text() == "ran\n"


def test_by_default_thirty_two_wait_in_line_behind_a_short_job_and_all_run_in_turn(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD.replace("start_ahead_depth = 2\n", ""))
    assert JobsConfig().start_ahead_depth == 32
    first, _ = gated_then_behind(d, 0)
    line = [d.submit("sh", "-c", "echo ran >> c", mem_key=KEY, gpus=0) for _ in range(31)]
    d.wait_for(lambda: all(d.show(j)["starting"] for j in line), what="a line of thirty-two")
    last = d.submit("true", mem_key=KEY, gpus=0)
    held = d.wait_for(lambda: (j := d.show(last))["waiting_for"] and j, what="a hold")
    assert held["state"] == "queued" and not held["starting"]
    (d.root / "go").touch()
    assert all(d.wait_done(j)["state"] == "succeeded" for j in [first, *line, last])
    assert (d.root / "b").read_text() == "ran\n" and (d.root / "c").read_text() == "ran\n" * 31


def test_a_hang_of_its_card_puts_the_whole_chain_behind_it_back_in_the_queue(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second, third = gated_then_chain(d, 1)
    d.append_kernel(XID_109_CARD0)
    for job in (second, third):

        def ended(j: int = job) -> Any:
            return (a := attempts(d, j)) and a[0]["reason"] and a

        behind = d.wait_for(ended, what="end")
        assert behind[0]["reason"] == "interrupted" and behind[0]["pid"] is None
    assert attempts(d, first)[0]["reason"] == "gpu_hang"
    (d.root / "go").touch()
    for job in (first, second, third):
        assert d.wait_done(job, timeout=60)["state"] == "succeeded"
    # Each ran once, as its second attempt, once its card was back.
    assert (d.root / "b").read_text() == (d.root / "c").read_text() == "ran\n"


def test_a_drain_lets_a_chain_claimed_ahead_go_without_running_any_of_it(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second, third = gated_then_chain(d, 0)
    assert d.stop() == 0
    assert not (d.root / "b").exists() and not (d.root / "c").exists()
    d.start()
    (d.root / "go").touch()
    for job in (first, second, third):
        done = d.wait_done(job)
        assert done["state"] == "succeeded" and done["attempts"][0]["reason"] == "interrupted"
    assert (d.root / "b").read_text() == (d.root / "c").read_text() == "ran\n"


def test_a_depth_of_one_claims_a_single_job_behind_a_running_one(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD.replace("depth = 2", "depth = 1"))
    first, second = gated_then_behind(d, 1)
    third = d.submit("true", mem_key=KEY)
    held = d.wait_for(lambda: (j := d.show(third))["waiting_for"] and j, what="a hold")
    assert held["state"] == "queued" and not held["starting"]
    (d.root / "go").touch()
    assert [d.wait_done(j)["state"] for j in (first, second, third)] == ["succeeded"] * 3


def test_a_daemon_killed_with_a_line_waiting_runs_each_of_it_once_after_restart(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=AHEAD)
    first, second, third = gated_then_chain(d, 1)
    pid = d.wait_pid(first)
    d.kill9()
    d.start()  # its attach closes the old connection: the keeper drops the whole line
    assert d.wait_pid(first) == pid
    (d.root / "go").touch()
    for job in (second, third):
        done = d.wait_done(job)
        assert done["state"] == "succeeded"
        assert [(a["n"], a["reason"]) for a in done["attempts"]] == [(1, None)]  # ran once
    assert d.wait_done(first)["attempts"][0]["pid"] == pid
    assert (d.root / "b").read_text() == (d.root / "c").read_text() == "ran\n"


def test_a_batch_on_idle_cards_runs_each_job_once_and_one_at_a_time_on_each_card(
    make_daemon: Callable[..., Daemon],
) -> None:
    """The pass that claims each idle card's first job of a batch claims the jobs behind
    it too, before that one has started; each spawn still reaches its keeper after the
    one it follows, so no card runs two of them at once, and each runs once."""
    d = make_daemon(gpus="2x8G", config=AHEAD.replace("depth = 2", "depth = 4"))
    marks = 'echo "$GPUSV_JOB_ID $(date +%s.%N)" >> {}'
    script = f"{marks.format('starts')}; sleep 0.05; {marks.format('ends')}"
    one = d.cli(
        "submit", "--gpus", "1", "--mem-key", KEY, "--batch", "-", input=f"sh -c '{script}'\n"
    )
    d.wait_done(int(one.stdout))  # the kind is short from now on
    (d.root / "starts").unlink()
    (d.root / "ends").unlink()
    batch = f"sh -c '{script}'\n" * 10
    out = d.cli("submit", "--gpus", "1", "--mem-key", KEY, "--batch", "-", input=batch).stdout
    jobs = [d.wait_done(int(j)) for j in out.split()]
    assert [j["state"] for j in jobs] == ["succeeded"] * 10
    behind = [j for j in jobs if any("starting once job" in e["message"] for e in j["events"])]
    assert behind  # lines were claimed
    starts = dict(line.split() for line in (d.root / "starts").read_text().splitlines())
    ends = dict(line.split() for line in (d.root / "ends").read_text().splitlines())
    assert sorted(map(int, starts)) == sorted(j["id"] for j in jobs)  # each ran once
    for card in (0, 1):
        ran = sorted(
            (float(starts[str(j["id"])]), float(ends[str(j["id"])]))
            for j in jobs
            if j["attempts"][0]["gpus"] == [card]
        )
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(ran)), ran
