"""Host-RAM admission, OOM ranking and the squeeze guard, with real memory-hungry jobs."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper.cgroup import remove_tree

from .conftest import Daemon

PY = sys.executable
# Allocate and touch N MiB, hold it until $RELEASE exists, exit 0. What varies between
# runs is in the environment, so every run has the same memory key.
HOG = (
    "import sys, time, os; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * "
    "len(b[::4096])\n"
    "while not os.path.exists(os.environ['RELEASE']): time.sleep(0.05)"
)


def hog(d: Daemon, mb: int, release: Path, **opts: object) -> int:
    return d.submit(PY, "-c", HOG, str(mb), env={"RELEASE": str(release)}, **opts)


def peak_seen(d: Daemon, job: int, mb: int) -> None:
    """Wait until the sampler has seen the running attempt at `mb` MiB or more."""
    d.wait_for(
        lambda: ((d.show(job)["attempts"] or [{}])[-1].get("peak_rss_mb") or 0) >= mb,
        what=f"job {job}'s peak of {mb} MiB to be sampled",
    )


def hog_once(d: Daemon, mb: int) -> dict[str, Any]:
    """A finished run of `mb` MiB whose peak the daemon recorded."""
    release = d.root / f"release-{uuid.uuid4().hex[:8]}"
    job = hog(d, mb, release)
    peak_seen(d, job, mb)
    release.touch()
    return d.wait_done(job)


CONFIG = """
[host_memory]
limit = "600M"
reserve = "10M"
sample_interval_s = 0.1
"""


def queue_waits(job: dict[str, object]) -> list[dict[str, object]]:
    events = job["events"]
    assert isinstance(events, list)
    return [e for e in events if e["kind"] == "queue_wait" and e["reason"] == "host_ram"]


def passes_behind(d: Daemon, held: int, passes: int = 3) -> None:
    """Witness `passes` dispatch passes that judged the held job again: jobs with no
    memory figure, queued after it, started one at a time on the idle card. A pass reads
    the queue in order and never leaves out a job held for host RAM, so the pass that
    started each of them judged the held job first."""
    for _ in range(passes):
        small = d.submit("sh", "-c", "echo small")
        assert d.wait_done(small)["state"] == "succeeded"
    assert d.show(held)["state"] == "queued"


def test_two_heavy_jobs_one_runs_one_is_held_and_a_small_one_backfills(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config=CONFIG)
    seeded = hog_once(d, 300)
    assert seeded["state"] == "succeeded"
    assert seeded["attempts"][0]["peak_rss_mb"] >= 300
    release = d.root / "release"
    first = hog(d, 300, release)
    second = hog(d, 300, release)
    d.wait_state(first, "running")
    held = d.wait_for(
        lambda: (j := d.show(second))["waiting_for"] and j, what="the second job to be held"
    )
    assert held["state"] == "queued"
    assert held["waiting_for"].startswith("waiting for host RAM: needs ~")
    assert held["host_memory"]["basis"] == "observed"
    assert held["host_memory"]["runs"] == 1
    assert held["host_memory"]["projected_mb"] >= 300
    listed = {j["id"]: j for j in json.loads(d.cli("list", "--json").stdout)}
    assert listed[second]["waiting_for"] == held["waiting_for"]
    # A card is idle, and a never-run job (no figure) backfills onto it.
    gpus = json.loads(d.cli("gpus", "--json").stdout)
    assert sorted(len(g["running_jobs"]) for g in gpus) == [0, 1]
    passes_behind(d, second)
    assert d.show(second)["waiting_for"] == held["waiting_for"]
    assert len(queue_waits(d.show(second))) == 1
    release.touch()
    for job in (first, second):
        assert d.wait_done(job)["state"] == "succeeded"
    assert len(queue_waits(d.show(second))) == 1
    assert d.show(second)["waiting_for"] is None


def test_dry_run_shows_the_observed_projection(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(config=CONFIG)
    hog_once(d, 100)
    dry = json.loads(d.cli("submit", "--dry-run", "--json", "--", PY, "-c", HOG, "100").stdout)
    assert dry["host_memory"]["basis"] == "observed"
    assert 100 <= dry["host_memory"]["projected_mb"] <= 200


def test_cancelling_a_held_job_leaves_other_holds_intact(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config=CONFIG, gpus="3x8G")
    release = d.root / "release"
    big = hog(d, 50, release, mem_mb=500)
    d.wait_state(big, "running")
    held = [d.submit("sleep", "0.1", mem_mb=400) for _ in range(2)]
    for job in held:

        def holding(j: int = job) -> Any:
            return d.show(j)["waiting_for"]

        d.wait_for(holding, what="a hold")
    d.cli("cancel", str(held[0]))
    assert d.show(held[0])["waiting_for"] is None
    assert d.show(held[0])["state"] == "cancelled"
    assert d.show(held[1])["waiting_for"].startswith("waiting for host RAM")
    release.touch()
    assert d.wait_done(held[1])["state"] == "succeeded"


def test_squeeze_guard_stops_the_newest_job(make_any_daemon: Callable[..., Daemon]) -> None:
    # MemAvailable is always below a threshold this high: the guard must act at once.
    config = CONFIG + 'squeeze_below = "1000T"\nlimit = "2000T"\n'
    d = make_any_daemon(config=config.replace('limit = "600M"\n', ""))
    job = d.submit("sleep", "300", retries=0)
    done = d.wait_done(job)
    assert done["reason"] == "oom_killed"
    assert done["attempts"][0]["evidence"]["source"] == "squeeze_guard"


def _memory_cgroup_v1() -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    return root if (root / "memory.limit_in_bytes").exists() else None


def _memory_cgroup_v2() -> Path | None:
    root = Path("/sys/fs/cgroup")
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return root
    return None


@contextlib.contextmanager
def memory_cgroup(limit_mb: int) -> Iterator[Path]:
    """A memory-limited cgroup for the daemon and its jobs (v1 or v2)."""
    name = f"gpusv-test-{uuid.uuid4().hex[:8]}"
    if (v2 := _memory_cgroup_v2()) is not None:
        path = v2 / name
        path.mkdir()
        (path / "memory.max").write_text(str(limit_mb << 20))
        (path / "memory.swap.max").write_text("0")
    elif (v1 := _memory_cgroup_v1()) is not None:
        path = v1 / name
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        with contextlib.suppress(OSError):
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit_mb << 20))
    else:
        pytest.skip("no memory cgroup controller (v1 or v2) is available")
    try:
        yield path
    finally:
        # The daemon, its keepers and their jobs die with it, and the keepers' roots,
        # made below it, go too: no test leaves a cgroup behind.
        remove_tree(path)


GROW = (
    "import time; chunks = []\n"
    "while True:\n"
    "    b = bytearray(10 << 20); b[::4096] = b'x' * len(b[::4096]); chunks.append(b)\n"
    "    time.sleep(0.02)"
)


def daemon_inside(cgroup: Path, make_daemon: Callable[..., Daemon]) -> Daemon:
    """A daemon started in the memory-limited cgroup: its jobs' cgroups lie below it."""
    d = make_daemon(start=False, config="[host_memory]\nsample_interval_s = 0.1\n")
    wrapper = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
    with open(d.log, "ab") as log:
        d.proc = subprocess.Popen(
            ["sh", "-c", wrapper, "sh", *d.argv()], stdout=log, stderr=log, env=d.env
        )
    d.wait_ready()
    return d


@pytest.mark.root("creating a memory cgroup needs root")
def test_real_kernel_oom_kills_the_newest_job_not_the_older_larger_one(
    make_daemon: Callable[..., Daemon],
) -> None:
    grow = GROW
    with memory_cgroup(450) as cgroup:
        d = daemon_inside(cgroup, make_daemon)
        release = d.root / "release"
        older = hog(d, 200, release, retries=0)
        peak_seen(d, older, 200)
        pid = d.wait_pid(older)
        d.wait_for(lambda: oom_score_adj(pid) == 1000, what="the older job ranked, alone")
        newer = d.submit(PY, "-c", grow, retries=0)
        killed = d.wait_done(newer, timeout=60)
        assert killed["reason"] == "oom_killed", killed["attempts"]
        assert killed["attempts"][0]["signal"] == 9
        # Told from the job's own cgroup counter, not the machine's or the daemon's.
        assert killed["attempts"][0]["evidence"] == {"source": "job_cgroup_oom_kill"}
        assert d.show(older)["state"] == "running"
        release.touch()
        assert d.wait_done(older)["state"] == "succeeded"
        d.stop()


def test_a_hold_is_not_announced_again_after_a_restart(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config=CONFIG)
    big = d.submit("sleep", "60", mem_mb=500)
    d.wait_state(big, "running")
    held = d.submit("sleep", "0.1", mem_mb=400)
    d.wait_for(lambda: d.show(held)["waiting_for"], what="a hold")
    d.kill9()
    d.start()
    d.wait_state(big, "running")
    passes_behind(d, held)
    assert d.show(held)["waiting_for"].startswith("waiting for host RAM")
    assert len(queue_waits(d.show(held))) == 1
    d.cli("cancel", str(big))
    assert d.wait_done(held)["state"] == "succeeded"


def oom_score_adj(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None


def test_the_newest_job_ranks_first_for_the_oom_killer_and_the_next_newest_takes_over(
    make_daemon: Callable[..., Daemon],
) -> None:
    # The daemon's own value is lowered (or kept at 0 here): older jobs go to 0.
    d = make_daemon(gpus="3x8G")
    jobs: list[int] = []
    pids: list[int] = []

    def ranks() -> list[int | None]:
        return [oom_score_adj(pid) for pid in pids]

    for n in range(3):
        jobs.append(d.submit("sleep", "300"))
        pids.append(d.wait_pid(jobs[-1]))
        expected = [0] * n + [1000]

        def ranked(e: list[int] = expected) -> bool:
            return ranks() == e

        d.wait_for(ranked, what=f"ranks {expected}, have {ranks()}")
    # The newest ends: the next newest is promoted.
    d.cli("cancel", str(jobs[2]))
    d.wait_done(jobs[2])
    pids.pop()
    d.wait_for(lambda: ranks() == [0, 1000], what=f"job 2 promoted, have {ranks()}")
    # An older job ends: the order stands.
    d.cli("cancel", str(jobs[0]))
    d.wait_done(jobs[0])
    assert oom_score_adj(pids[1]) == 1000
    d.cli("cancel", str(jobs[1]))


def _mem_available_mb() -> int:
    with open("/proc/meminfo") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
    return kb // 1024


# Ignores SIGTERM, so it holds its memory through the whole kill grace.
STUBBORN_HOG = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096])\n"
    "while True: time.sleep(1)"
)


@contextlib.contextmanager
def host_memory_to_ourselves() -> Iterator[None]:
    """Held across every copy of the suite on this machine (a lock file in /tmp): a test
    that sets its squeeze line from the host's MemAvailable and then moves it by GiBs
    must not overlap another copy of itself, whose hog would move the same figure."""
    with open(Path(tempfile.gettempdir()) / "gpusv-tests-host-memory.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def test_the_squeeze_guard_waits_for_its_victim_instead_of_stopping_one_job_per_pass(
    make_daemon: Callable[..., Daemon],
) -> None:
    with host_memory_to_ourselves():
        _squeeze_guard_waits_for_its_victim(make_daemon)


def _squeeze_guard_waits_for_its_victim(make_daemon: Callable[..., Daemon]) -> None:
    # The line sits 1500 MiB under MemAvailable now: the 3000 MiB hog alone crosses it,
    # and stopping the hog alone brings the machine back over it. The hog outlives
    # SIGTERM for the 3 s grace, some 30 sampler passes: none of them may stop another.
    hog_mb, line_mb = 3000, _mem_available_mb() - 1500
    config = (
        f'[host_memory]\nsample_interval_s = 0.1\nsqueeze_below = "{line_mb}M"\n'
        "[jobs]\nkill_grace_s = 3\n"
    )
    d = make_daemon(gpus="3x8G", config=config)
    older = [d.submit("sleep", "300") for _ in range(2)]
    for job in older:
        d.wait_pid(job)
    hog = d.submit(PY, "-c", STUBBORN_HOG, str(hog_mb), retries=0)
    done = d.wait_done(hog, timeout=60)
    assert done["reason"] == "oom_killed"
    assert done["attempts"][0]["evidence"]["source"] == "squeeze_guard"
    assert done["attempts"][0]["signal"] == 9  # it did hold on through the grace
    for job in older:
        shown = d.show(job)
        if shown["state"] != "running":
            print(shown["attempts"], d.log_text()[-3000:])
        assert shown["state"] == "running"
        assert len(shown["attempts"]) == 1 and shown["attempts"][0]["reason"] is None
        d.cli("cancel", str(job))


@pytest.mark.root("creating a memory cgroup needs root")
def test_a_sigkill_after_another_jobs_oom_kill_is_not_taken_for_one(
    make_daemon: Callable[..., Daemon],
) -> None:
    """The older job, killed by hand after the newer one's OOM kill, has a counter of
    its own that did not move: it is `signal`, not `oom_killed`. (On cgroup v2 the
    daemon's counter counts its children's kills and moved for the newer job; cgroup v1
    counts each group's own, so here only the end-to-end path is checked, the rule
    itself in tests/daemon/running/test_oom_scores.py.)"""
    with memory_cgroup(300) as cgroup:
        d = daemon_inside(cgroup, make_daemon)
        older = hog(d, 20, d.root / "never", retries=0)
        pid = d.wait_pid(older)
        d.wait_for(lambda: oom_score_adj(pid) == 1000, what="the older job ranked, alone")
        newer = d.submit(PY, "-c", GROW, retries=0)
        killed = d.wait_done(newer, timeout=60)
        assert killed["attempts"][0]["evidence"] == {"source": "job_cgroup_oom_kill"}
        os.kill(pid, 9)
        done = d.wait_done(older)
        assert (done["reason"], done["attempts"][0]["signal"]) == ("signal", 9), done["attempts"]
        assert done["attempts"][0]["evidence"] is None
        d.stop()
