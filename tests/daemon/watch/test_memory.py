from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.daemon.watch.memory import TreeSampler, available_mb, read_meminfo

# Bytes multiplication writes every page, so the memory is resident, not just reserved.
HOG = """
import sys, time
buf = b"\\x01" * (int(sys.argv[1]) << 20)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "free":
        buf = b""
        print("freed", flush=True)
if sys.argv[2:] == ["linger"]:
    time.sleep(600)
"""

# A job root (holding 50 MB) with a child hog of 30 MB; prints the child's pid.
ROOT = """
import subprocess, sys
buf = b"\\x01" * (50 << 20)
child = subprocess.Popen([sys.executable, sys.argv[1], "30"], stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.read()
child.kill()
"""

# A job root whose middle process starts a daemonized hog (new session) and then exits,
# so that the hog is reparented away from the job's tree.
DAEMONIZING_ROOT = """
import subprocess, sys
middle_code = '''
import subprocess, sys
hog = subprocess.Popen([sys.executable, sys.argv[1], "20", "linger"], stdout=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, text=True, start_new_session=True)
hog.stdout.readline()
print(hog.pid, flush=True)
sys.stdin.read()
'''
middle = subprocess.Popen([sys.executable, "-c", middle_code, sys.argv[1]],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(middle.stdout.readline().strip(), middle.pid, flush=True)
sys.stdin.readline()
middle.stdin.close()
middle.wait()
print("middle gone", flush=True)
sys.stdin.read()
"""


def start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture
def hog_script(tmp_path: Path) -> Path:
    path = tmp_path / "hog.py"
    path.write_text(HOG)
    return path


@pytest.fixture
def tree(hog_script: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    root = start(ROOT, str(hog_script))
    assert root.stdout is not None
    child = int(root.stdout.readline())
    yield root, child
    stop(root)


def proc_meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":")
        fields[key] = int(value.split()[0])
    return fields


def test_read_meminfo_agrees_with_proc_meminfo() -> None:
    info = read_meminfo()
    assert info.total_mb == proc_meminfo()["MemTotal"] // 1024
    assert 0 < info.available_mb <= info.total_mb
    assert info.swap_used_mb >= 0


def test_a_tree_is_summed_over_root_and_children(tree: tuple[subprocess.Popen[str], int]) -> None:
    root, child = tree
    sample = TreeSampler().sample({7: root.pid})[7]
    assert {root.pid, child} <= sample.pids
    assert sample.rss_mb >= 80  # 50 MB in the root, 30 in the child, plus interpreters
    assert sample.peak_mb == sample.rss_mb


def test_jobs_are_sampled_apart(tree: tuple[subprocess.Popen[str], int]) -> None:
    root, _ = tree
    other = start(HOG, "10")
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        samples = TreeSampler().sample({1: root.pid, 2: other.pid})
        assert samples[2].pids == {other.pid}
        assert other.pid not in samples[1].pids
        assert 10 <= samples[2].rss_mb < samples[1].rss_mb
    finally:
        stop(other)


def test_a_process_older_than_the_root_is_never_the_job(
    tree: tuple[subprocess.Popen[str], int],
) -> None:
    root, _ = tree
    sample = TreeSampler().sample({1: root.pid}, known={1: {os.getpid()}})[1]
    assert os.getpid() not in sample.pids


def test_peak_is_kept_after_memory_is_freed(hog_script: Path) -> None:
    hog = start(HOG, "60")
    try:
        assert hog.stdin is not None and hog.stdout is not None
        assert hog.stdout.readline() == "ready\n"
        sampler = TreeSampler()
        high = sampler.sample({1: hog.pid})[1]
        hog.stdin.write("free\n")
        hog.stdin.flush()
        assert hog.stdout.readline() == "freed\n"
        low = sampler.sample({1: hog.pid})[1]
        assert low.rss_mb < high.rss_mb - 40
        assert low.peak_mb == high.rss_mb
        # A job no longer sampled is forgotten: its next run starts from nothing.
        assert sampler.sample({}) == {}
        assert sampler.sample({1: hog.pid})[1].peak_mb == low.rss_mb
    finally:
        stop(hog)


def test_a_reparented_descendant_is_still_counted(hog_script: Path) -> None:
    root = start(DAEMONIZING_ROOT, str(hog_script))
    assert root.stdin is not None and root.stdout is not None
    hog_pid, middle_pid = map(int, root.stdout.readline().split())
    try:
        sampler = TreeSampler()
        before = sampler.sample({1: root.pid})[1]
        assert {root.pid, middle_pid, hog_pid} <= before.pids

        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline() == "middle gone\n"
        assert read_ppid(hog_pid) not in (root.pid, middle_pid)

        after = sampler.sample({1: root.pid})[1]
        assert hog_pid in after.pids
        assert after.rss_mb >= 20
        # What makes it work: a sampler that never saw it in the tree cannot find it...
        assert hog_pid not in TreeSampler().sample({1: root.pid})[1].pids
        # ...unless the caller knows the pid.
        known = TreeSampler().sample({1: root.pid}, known={1: {hog_pid}})[1]
        assert hog_pid in known.pids
    finally:
        os.kill(hog_pid, signal.SIGKILL)
        stop(root)


def read_ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def test_available_mb_reads_memavailable_as_read_meminfo_does() -> None:
    fast, full = available_mb(), read_meminfo().available_mb
    assert fast > 0
    assert abs(fast - full) < 1024  # two reads a moment apart; the box is not still
