from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.core import oom as ranking
from supervisor.daemon import cgroups
from supervisor.daemon.running import oom_scores as oom
from supervisor.keeper.cgroup import parse_oom_kill

MB = 1024 * 1024

# --- ranking (pure) -------------------------------------------------------------------


def test_newest_job_at_1000_every_older_process_at_base() -> None:
    values = ranking.oom_adjustments([10, 11], {1: [20, 21], 2: (30,)})
    assert values == {10: 1000, 11: 1000, 20: 0, 21: 0, 30: 0}


def test_the_newest_job_wins_a_pid_listed_twice() -> None:
    assert ranking.oom_adjustments([10], {1: [10, 20]}, base=200) == {10: 1000, 20: 200}


def test_base_value_never_below_zero_nor_below_the_daemon() -> None:
    assert ranking.base_value(-900) == 0
    assert ranking.base_value(0) == 0
    assert ranking.base_value(200) == 200


def test_newest_job_is_the_last_dispatched() -> None:
    assert ranking.newest_job({4: 17, 9: 12, 2: 30}) == 2


# own, sigkill, in_kernel_log, daemon_moved, squeezed -> source
SOURCES = [
    (1, False, False, False, False, "job_cgroup_oom_kill"),  # a child killed, leader exits 1
    (1, True, True, True, True, "job_cgroup_oom_kill"),
    (0, False, True, True, True, None),  # no SIGKILL: never an OOM kill
    (0, True, True, False, False, "kernel_log"),
    (None, True, False, True, False, "cgroup_oom_kill"),  # no counter of its own
    (0, True, False, True, False, None),  # the daemon's counter moved for another job
    (0, True, False, True, True, "memory_squeeze"),  # a userspace OOM killer
    (None, True, False, False, False, None),  # a kill -9 by hand
]


@pytest.mark.parametrize(("own", "sigkill", "line", "moved", "squeezed", "source"), SOURCES)
def test_why_an_end_counts_as_an_oom_kill(
    own: int | None, sigkill: bool, line: bool, moved: bool, squeezed: bool, source: str | None
) -> None:
    got = ranking.oom_source(
        sigkill=sigkill, own=own, in_kernel_log=line, daemon_moved=moved, squeezed=squeezed
    )
    assert got == source
    assert ranking.newest_job({}) is None


def test_no_squeeze_no_victims() -> None:
    assert ranking.squeeze_victims(5000, 3000, [(1, 1, 100)]) == []


def test_squeeze_stops_the_newest_dispatched_first_as_many_as_needed() -> None:
    running = [(1, 1, 60_000), (2, 3, 500), (3, 2, 2_000)]
    assert ranking.squeeze_victims(2000, 3000, running) == [2, 3]
    assert ranking.squeeze_victims(2900, 3000, running) == [2]


def test_squeeze_takes_at_least_one_even_if_it_frees_little() -> None:
    assert ranking.squeeze_victims(100, 3000, [(1, 1, 0), (2, 2, 0)]) == [2, 1]
    assert ranking.squeeze_victims(100, 3000, []) == []


# (MemAvailable, the line, running (job, dispatch seq, RSS MB)) -> the jobs stopped, in order.
SQUEEZES = [
    ((3000, 3000, [(1, 1, 100)]), []),  # exactly at the line: not under it
    ((2999, 3000, [(1, 1, 100)]), [1]),
    ((2000, 3000, [(1, 1, 5000), (2, 2, 1000)]), [2]),  # freeing exactly enough is enough
    ((2000, 3000, [(1, 1, 5000), (2, 2, 999)]), [2, 1]),
    ((2000, 3000, [(1, 2, 100), (2, 1, 100), (3, 3, 100)]), [3, 1, 2]),  # by dispatch, not id
    ((2000, 3000, [(4, 5, 100), (7, 5, 100), (1, 1, 100)]), [7, 4, 1]),  # a tie: the higher id
    ((2000, 3000, [(1, 1, 100), (2, 2, 2000), (3, 3, 0)]), [3, 2]),  # by dispatch, not size
    ((2000, 3000, [(1, 1, 100), (2, 2, 600), (3, 3, 500)]), [3, 2]),  # what they free adds up
]


@pytest.mark.parametrize(("args", "victims"), SQUEEZES)
def test_squeeze_victims_by_table(
    args: tuple[int, int, list[tuple[int, int, int]]], victims: list[int]
) -> None:
    assert ranking.squeeze_victims(*args) == victims


# --- /proc writes on real processes ---------------------------------------------------


def test_apply_writes_values_that_read_back(sleepers: list[subprocess.Popen[bytes]]) -> None:
    a, b, c = (p.pid for p in sleepers[:3])
    base = ranking.base_value(oom.read_value() or 0)
    assert oom.apply({a: 1000, b: base, c: 500}) == []
    assert [oom.read_value(pid) for pid in (a, b, c)] == [1000, base, 500]
    # Back down from 1000, as happens to a job once a newer one starts.
    assert oom.apply({a: base}) == []
    assert oom.read_value(a) == base


def test_apply_skips_vanished_processes_and_reports_refusals(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    failures = oom.apply({gone.pid: 1000, sleepers[0].pid: 5000})
    assert len(failures) == 1
    assert failures[0].startswith(f"pid {sleepers[0].pid}: cannot set oom_score_adj 5000")


def test_preexec_hook_sets_the_child_and_its_descendants() -> None:
    script = "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"
    out = subprocess.run(
        ["sh", "-c", script],
        preexec_fn=oom.preexec_oom_score_adj(1000),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert out.stdout.split() == ["1000", "1000"]
    assert oom.read_value() != 1000  # the parent is untouched


def test_preexec_hook_fails_the_spawn_when_it_cannot_set_the_value() -> None:
    with pytest.raises(subprocess.SubprocessError):
        subprocess.run(["true"], preexec_fn=oom.preexec_oom_score_adj(5000), timeout=30)


SELF_ADJUST = (
    "import json; from supervisor.daemon.running import oom_scores as oom;"
    "w = oom.daemon_self_adjust(); print(json.dumps([w, oom.read_value()]))"
)


def _self_adjust(start: int, *, drop_cap: bool) -> tuple[str | None, int]:
    """daemon_self_adjust in a fresh process that starts at `start`, with or without
    CAP_SYS_RESOURCE (setpriv drops it from the bounding set, so root exec()s without)."""
    prefix = "exec setpriv --bounding-set=-sys_resource" if drop_cap else "exec"
    script = f'echo {start} > /proc/self/oom_score_adj; {prefix} "$@"'
    out = subprocess.run(
        ["sh", "-c", script, "sh", sys.executable, "-c", SELF_ADJUST],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    warning, after = json.loads(out.stdout)
    return warning, after


def _has_cap_sys_resource() -> bool:
    with open("/proc/self/status") as fh:
        eff = next(line.split()[1] for line in fh if line.startswith("CapEff:"))
    return bool(int(eff, 16) >> 24 & 1)  # CAP_SYS_RESOURCE is capability 24


needs_root = pytest.mark.root("needs root and setpriv")


@pytest.mark.skipif(
    not _has_cap_sys_resource(), reason="this process has no CAP_SYS_RESOURCE to pass on"
)
def test_daemon_self_adjust_lowers_itself_with_the_capability() -> None:
    assert _self_adjust(0, drop_cap=False) == (None, -900)
    assert _self_adjust(300, drop_cap=False) == (None, -900)


@needs_root
def test_daemon_self_adjust_without_the_capability_says_the_daemon_is_unshielded() -> None:
    warning, after = _self_adjust(0, drop_cap=True)
    assert after == 0
    assert warning == (  # the normal case for a daemon a user runs: no fault, no errno
        "oom_score_adj: the daemon stays at 0, not -900, as a daemon without "
        "CAP_SYS_RESOURCE does (systemd's OOMScoreAdjust= or root lowers it); jobs are "
        "still killed newest first"
    )


@needs_root
def test_daemon_self_adjust_without_the_capability_above_zero_says_what_jobs_lose() -> None:
    warning, after = _self_adjust(200, drop_cap=True)
    assert after == 200
    assert warning is not None
    assert "stays at 200, not -900" in warning and "older jobs get no value below 200;" in warning


def test_daemon_self_adjust_never_raises_the_daemon() -> None:
    current = oom.read_value()
    assert current is not None
    assert oom.daemon_self_adjust(target=current + 1) is None
    assert oom.read_value() == current


# Run as user nobody: a "daemon" shell starts a "job" that raises itself to 1000, then
# lowers it back to the base value, then tries to go below its inherited floor.
UNPRIVILEGED = """
own=$(cat /proc/self/oom_score_adj)
if [ "$own" -gt 0 ]; then base=$own; else base=0; fi
sh -c 'echo 1000 > /proc/self/oom_score_adj && exec sleep 60' &
job=$!
i=0
while [ "$(cat /proc/$job/oom_score_adj)" != 1000 ] && [ $i -lt 3000 ]; do
    sleep 0.01; i=$((i + 1))
done
new=$(cat /proc/$job/oom_score_adj)
{ echo "$base" > /proc/$job/oom_score_adj; } 2>/dev/null
lowered=$(cat /proc/$job/oom_score_adj)
if { echo -1000 > /proc/$job/oom_score_adj; } 2>/dev/null; then refused=no; else refused=yes; fi
kill $job
echo "$new $base $lowered $refused"
"""


def test_unprivileged_daemon_can_lower_an_older_job_back_from_1000() -> None:
    """The kernel rule that base_value() rests on, checked as a user without privileges."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    out = subprocess.run(
        ["sh", "-c", UNPRIVILEGED],
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    new, base, lowered, refused = out.stdout.split()
    assert new == "1000"
    assert lowered == base == str(ranking.base_value(int(base)))
    assert refused == "yes"  # below the floor it inherited, an unprivileged write fails


# --- cgroups --------------------------------------------------------------------------


def test_parse_proc_cgroup_v1_and_v2() -> None:
    v1 = "9:name=systemd:/\n4:memory:/jobs/7\n2:cpu,cpuacct:/\n0::/\n"
    assert cgroups.parse_proc_cgroup(v1, 1) == "/jobs/7"
    assert cgroups.parse_proc_cgroup("0::/system.slice/gpusvd.service\n", 2) == (
        "/system.slice/gpusvd.service"
    )
    assert cgroups.parse_proc_cgroup("4:cpu:/x\n", 1) is None


def test_parse_oom_kill_from_memory_events_and_oom_control() -> None:
    events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
    assert parse_oom_kill(events) == 2
    assert parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n") == 5
    assert parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n") is None


def test_own_memory_cgroup_is_a_real_directory() -> None:
    if cgroups.detect() is None:
        pytest.skip("no memory cgroup controller here")
    own = cgroups.own_memory_cgroup()
    assert own is not None and own.is_dir()
    assert os.getpid() in cgroups.pids(own)


@pytest.fixture
def memcg() -> Iterator[Callable[[int], Path]]:
    """Makes memory cgroups with a limit and no swap; removes them even on failure."""
    hierarchy = cgroups.detect()
    if os.geteuid() != 0 or hierarchy is None:
        pytest.skip("needs root and a memory cgroup controller")
    made: list[Path] = []

    def make(limit_mb: int) -> Path:
        path = cgroups.create(hierarchy.root, f"gpusv-test-{secrets.token_hex(4)}")
        made.append(path)
        # Swap would let the group page out instead of reaching the OOM killer.
        for name in ("memory.swap.max", "memory.swappiness"):
            with contextlib.suppress(OSError):
                (path / name).write_text("0")
        cgroups.set_limit(path, limit_mb * MB)
        with contextlib.suppress(OSError):
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit_mb * MB))
        return path

    yield make
    for path in made:
        assert cgroups.remove(path), f"could not remove {path}"


HOG = "buf = b'\\x01' * (200 << 20)"
OLDER = """
import sys, time
buf = b"\\x01" * (150 << 20)
print("ready", flush=True)
time.sleep(120)
"""
NEWER = """
import time
chunks = []
while True:
    chunks.append(b"\\x01" * (10 << 20))
    time.sleep(0.01)
"""


def spawn(code: str, cgroup: Path, adj: int) -> subprocess.Popen[str]:
    join, set_adj = cgroups.preexec_join(cgroup), oom.preexec_oom_score_adj(adj)

    def preexec() -> None:
        join()
        set_adj()

    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, preexec_fn=preexec
    )


def test_a_job_over_its_cgroup_limit_is_oom_killed_and_counted(
    memcg: Callable[[int], Path],
) -> None:
    group = memcg(64)
    assert cgroups.oom_kill_count(group) == 0
    hog = spawn(HOG, group, 0)
    assert hog.wait(timeout=60) == -signal.SIGKILL
    assert cgroups.oom_kill_count(group) == 1


def test_the_kernel_kills_the_newest_job_not_the_bigger_older_one(
    memcg: Callable[[int], Path],
) -> None:
    group = memcg(300)
    base = ranking.base_value(oom.read_value() or 0)
    older = spawn(OLDER, group, base)
    newer: subprocess.Popen[str] | None = None
    try:
        assert older.stdout is not None and older.stdout.readline() == "ready\n"
        newer = spawn(NEWER, group, ranking.NEWEST)
        assert newer.wait(timeout=60) == -signal.SIGKILL
        time.sleep(0.2)  # a second kill would land right after the first
        assert older.poll() is None, "the older job was killed"
        assert cgroups.oom_kill_count(group) == 1
        peak = cgroups.memory_peak_mb(group)
        assert peak is not None and peak >= 150
    finally:
        for p in (older, newer):
            if p is not None:
                p.kill()
                p.wait()
