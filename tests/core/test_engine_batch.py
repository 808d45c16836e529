"""Commands stepped together in one draft (the engine's batch while a commit is in flight)
decide exactly what the same commands decide stepped one by one, each applied before the
next: the same table after, the same writes and the same actions, in the same order."""

from __future__ import annotations

import random
import signal
from typing import Any

import pytest

from supervisor.core import commands as c
from supervisor.core.admission import Hold, Start
from supervisor.core.engine import step, steps
from supervisor.core.jobqueue import INF
from supervisor.core.jobs import ExitStatus, FailureReason, JobSpec, JobState
from supervisor.core.outcome import Facts
from supervisor.core.table import Live, Phase, Table

NOW = c.Now(1_700_000_000.0, 500.0)
CARDS = (0, 1, 2)
STATUSES = (ExitStatus(0, None), ExitStatus(3, None), ExitStatus(None, signal.SIGKILL))


def spec(rng: random.Random, ids: list[int]) -> JobSpec:
    after = tuple(rng.sample(ids, 1)) if ids and rng.random() < 0.3 else ()
    gpus = rng.choice((0, 1, 1, 2))
    return JobSpec(("train",), "/", {}, 1000, 1000, gpus=gpus, after=after, mem_key="k")


def command(rng: random.Random, t: Table) -> c.Command:
    """A command that may do something to the table as it is (or nothing: a stale one)."""
    queued = [j.id for j in t.jobs.values() if j.state is JobState.QUEUED]
    lives = list(t.live.items())
    kinds = ["dispatch", "hold", "cancel", "holdjob", "progress", "stale"]
    if lives:
        kinds += ["spawning", "started", "ended", "ended", "stop", "hang", "cancel_running"]
    kind = rng.choice(kinds)
    if kind == "dispatch" and queued:
        picked = rng.sample(queued, min(len(queued), rng.randint(1, 3)))
        starts = []
        for job_id in picked:
            cards = tuple(rng.sample(CARDS, t.jobs[job_id].spec.gpus))
            ahead = [(j, r.attempt.n) for j, r in lives if r.phase is Phase.RUNNING]
            after = rng.choice(ahead) if ahead and rng.random() < 0.3 else None
            starts.append(Start(job_id, cards, 0, after))
        return c.Dispatch(tuple(starts), (), full=frozenset({"gpu"}))
    if kind == "hold" and queued:
        holds = tuple(
            Hold(j, rng.choice(("gpus", "cpu", "host_ram")), f"waits ({rng.randint(0, 1)})")
            for j in rng.sample(queued, min(2, len(queued)))
        )
        return c.Dispatch((), holds, full=frozenset(rng.sample(("gpu", "cpu"), 1)))
    if kind in ("cancel", "holdjob") and queued:
        job_id = rng.choice(queued)
        if kind == "cancel":
            return c.Cancel(job_id)
        return c.HoldJob(job_id, rng.random() < 0.6, 1000)
    if kind == "progress" and t.jobs:
        return c.Progress(rng.choice(list(t.jobs)), f"{rng.randint(0, 9)}0%")
    if not lives:
        return c.Cancel(10_000)  # no such job
    return _of_running(rng, kind, *rng.choice(lives))


def _of_running(rng: random.Random, kind: str, job_id: int, live: Live) -> c.Command:
    n = live.attempt.n
    match kind:
        case "spawning":
            return c.Spawning(job_id, n)
        case "started":
            return c.Started(job_id, n, 100 + job_id, None)
        case "ended":
            return c.Ended(job_id, n, Facts(rng.choice(STATUSES), peak_rss_mb=10))
        case "stop":
            reason = rng.choice((FailureReason.INTERRUPTED, FailureReason.TIMEOUT))
            return c.Stop(job_id, reason, {"message": "stopped"})
        case "hang":
            return c.HangSeen(job_id, 0, {"source": "kernel_log", "lines": ["NVRM: Xid 79"]})
        case "cancel_running":
            return c.Cancel(job_id)
    return c.Ended(job_id, n + 1, Facts(STATUSES[0]))  # an older attempt's: stale


def state(t: Table) -> dict[str, Any]:
    """The table as compared. The queue's `oldest` is an estimate, allowed to be early:
    what must hold of it is that it is no later than any settled job's hold. Entries of the
    retry backoff's heap that no longer hold are dropped when read."""
    q = t.queue
    for kind, keys in q.settled.items():
        if kind in q.oldest:
            assert all(q.oldest[kind] <= t.held_since.get(i, INF) for _, i in keys), kind
    backoff = {(at, i) for at, i in q.backoff if _backing_off(t, i, at)}
    return {
        **{k: v for k, v in vars(t).items() if k != "queue"},
        "queue": {k: v for k, v in vars(q).items() if k not in ("held", "oldest", "backoff")},
        "held": q.held_counts(),
        "backoff": backoff,
    }


def _backing_off(t: Table, job_id: int, at: float) -> bool:
    job = t.jobs.get(job_id)
    return job is not None and job.state is JobState.QUEUED and job.not_before == at


def script(seed: int) -> tuple[Table, list[c.Command]]:
    """A table with jobs submitted, and the commands that follow, each drawn on the table
    as the ones before it left it."""
    rng = random.Random(seed)
    t = Table()
    specs: list[JobSpec] = []
    for i in range(rng.randint(3, 8)):
        specs.append(spec(rng, list(range(1, i + 1))))
    t.apply(step(t, c.SubmitJobs(tuple(specs)), NOW).changes)
    shadow, cmds = Table(), []
    shadow.apply(step(shadow, c.SubmitJobs(tuple(specs)), NOW).changes)
    for _ in range(rng.randint(5, 40)):
        cmd = command(rng, shadow)
        shadow.apply(step(shadow, cmd, NOW).changes)
        cmds.append(cmd)
    return t, cmds


@pytest.mark.parametrize("seed", range(300))
def test_commands_stepped_together_decide_what_they_decide_one_by_one(seed: int) -> None:
    base, cmds = script(seed)
    one, writes, actions = Table(), [], []
    one.apply(step(one, c.SubmitJobs(tuple(j.spec for j in base.jobs.values())), NOW).changes)
    for cmd in cmds:
        out = step(one, cmd, NOW)
        one.apply(out.changes)
        writes += out.writes
        actions += out.actions
    rng = random.Random(seed + 1)
    together, bwrites, bactions, i = base, [], [], 0
    while i < len(cmds):  # batches of 1 to 6 commands, as they happen to queue
        k = rng.randint(1, 6)
        out = steps(together, cmds[i : i + k], NOW)
        together.apply(out.changes)
        bwrites += out.writes
        bactions += out.actions
        i += k
    assert bwrites == writes
    assert bactions == actions
    assert state(together) == state(one)


def test_the_scripts_reach_every_kind_of_end() -> None:
    """The drawn commands do reach claims ahead, every kind of end, hangs, retries and
    failed dependencies."""
    seen: set[str] = set()
    for seed in range(300):
        t, cmds = script(seed)
        for cmd in cmds:
            out = step(t, cmd, NOW)
            t.apply(out.changes)
            for w in out.writes:
                seen.update(ev.kind for ev in getattr(w, "events", ()))
                if isinstance(w, c.SaveJob) and w.ended_attempt is not None:
                    seen.add(f"ended {w.job.state}")
            if isinstance(cmd, c.Dispatch) and any(s.after for s in cmd.starts):
                seen.add("claimed ahead")
    ends = {f"ended {s}" for s in ("succeeded", "failed", "cancelled", "queued")}
    kinds = {"dependency_failed", "gpu_hang", "queue_wait", "retry_scheduled", "claimed ahead"}
    assert ends | kinds <= seen, seen
