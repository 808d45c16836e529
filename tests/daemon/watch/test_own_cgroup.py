"""The memory limit of the cgroup gpusvd runs in: cgroup v2 and v1 membership and
mount lines as /proc shows them, a tree of limit files under tmp_path standing for the
cgroup filesystems; and once on the machine's real v1 memory controller."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.daemon.watch.own_cgroup import memory_limit_mb

MIB = 1024 * 1024
V1_UNLIMITED = "9223372036854771712"  # what v1 writes for no limit


def proc_dir(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def limits(root: Path, tree: dict[str, str], name: str) -> None:
    for relative, value in tree.items():
        d = root / relative
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(value + "\n")


def test_v2_takes_the_tightest_limit_up_the_tree(tmp_path: Path) -> None:
    mnt = tmp_path / "unified"
    limits(mnt, {"": "max", "a": str(8192 * MIB), "a/b": str(16384 * MIB), "a/b/c": "max"},
           "memory.max")  # fmt: skip
    proc = proc_dir(
        tmp_path,
        "0::/a/b/c\n",
        f"30 23 0:26 / {mnt} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    assert memory_limit_mb(proc) == 8192


def test_v2_in_a_namespace_maps_the_path_under_the_mount_s_root(tmp_path: Path) -> None:
    mnt = tmp_path / "unified"
    limits(mnt, {"job": str(512 * MIB)}, "memory.max")
    proc = proc_dir(
        tmp_path,
        "0::/slurm/uid_0/job\n",
        f"30 23 0:26 /slurm/uid_0 {mnt} rw - cgroup2 cgroup2 rw\n",
    )
    assert memory_limit_mb(proc) == 512


def test_v1_reads_the_memory_hierarchy_and_ignores_no_limit(tmp_path: Path) -> None:
    mem = tmp_path / "memory"
    limits(mem, {"": V1_UNLIMITED, "pod": str(3000 * MIB), "pod/ctr": V1_UNLIMITED},
           "memory.limit_in_bytes")  # fmt: skip
    proc = proc_dir(
        tmp_path,
        "9:name=systemd:/pod/ctr\n5:cpu,cpuacct:/pod/ctr\n4:memory:/pod/ctr\n",
        f"31 23 0:28 / {tmp_path}/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
        f"35 31 0:32 / {mem} rw,relatime - cgroup cgroup rw,memory\n",
    )
    assert memory_limit_mb(proc) == 3000


def test_both_hierarchies_count(tmp_path: Path) -> None:
    mem, unified = tmp_path / "memory", tmp_path / "unified"
    limits(mem, {"x": str(4000 * MIB)}, "memory.limit_in_bytes")
    limits(unified, {"x": str(2500 * MIB)}, "memory.max")
    proc = proc_dir(
        tmp_path,
        "4:memory:/x\n0::/x\n",
        f"35 31 0:32 / {mem} rw - cgroup cgroup rw,memory\n"
        f"30 23 0:26 / {unified} rw - cgroup2 cgroup2 rw\n",
    )
    assert memory_limit_mb(proc) == 2500


def test_a_hierarchy_mounted_twice_is_read_where_it_shows_the_cgroup(tmp_path: Path) -> None:
    """A Slurm job in a container: the host's mount, made outside this cgroup namespace
    and covered by the container's own /sys/fs/cgroup, comes first in mountinfo."""
    covered, own = tmp_path / "sys/memory", tmp_path / "run/memory"
    limits(own, {"": V1_UNLIMITED, "slurm/job_1": str(400 * MIB), "slurm/job_1/step": V1_UNLIMITED},
           "memory.limit_in_bytes")  # fmt: skip
    limits(tmp_path / "elsewhere", {"slurm/job_1/step": str(100 * MIB)}, "memory.limit_in_bytes")
    proc = proc_dir(
        tmp_path,
        "4:memory:/slurm/job_1/step\n",
        f"54 50 0:32 /../.. {tmp_path}/elsewhere rw - cgroup cgroup rw,memory\n"
        f"73 69 0:32 / {covered} rw - cgroup cgroup rw,memory\n"
        f"97 94 0:32 / {own} rw - cgroup cgroup rw,memory\n",
    )
    assert memory_limit_mb(proc) == 400


def test_a_mount_root_is_a_whole_path_prefix(tmp_path: Path) -> None:
    mnt = tmp_path / "unified"
    limits(mnt, {"job_10": str(700 * MIB)}, "memory.max")
    proc = proc_dir(tmp_path, "0::/job_10\n", f"30 23 0:26 /job_1 {mnt} rw - cgroup2 cgroup2 rw\n")
    assert memory_limit_mb(proc) == 700


@pytest.mark.parametrize(
    ("cgroup", "mountinfo"),
    [
        ("0::/x\n", ""),  # no cgroup2 mount
        ("3:cpu:/x\n", "31 23 0:28 / /cpu rw - cgroup cgroup rw,cpu\n"),  # no memory controller
        ("4:memory:/x\n", "35 31 0:32 / /nowhere rw - cgroup cgroup rw,memory\n"),  # no files
        ("0::/x\n", "30 23 0:26 / /u rw cgroup2 cgroup2 rw\n"),  # a line without its "-"
    ],
)
def test_no_limit_to_find(tmp_path: Path, cgroup: str, mountinfo: str) -> None:
    assert memory_limit_mb(proc_dir(tmp_path, cgroup, mountinfo)) is None


def test_unreadable_proc_is_no_limit(tmp_path: Path) -> None:
    assert memory_limit_mb(tmp_path / "no-such-proc") is None


V1_MEMORY = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def limited() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a v1 memory cgroup of its own, limited to 300 MiB."""
    if not (V1_MEMORY / "cgroup.procs").exists():
        pytest.skip("no v1 memory controller here")
    group = V1_MEMORY / f"gpusv-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup: {exc}")
    proc = subprocess.Popen(["sleep", "300"])
    try:
        (group / "memory.limit_in_bytes").write_text(str(300 * MIB))
        (group / "cgroup.procs").write_text(str(proc.pid))
        yield proc
    finally:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while True:  # the kernel may take a moment to let go of a reaped member
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_a_real_v1_memory_cgroup(limited: subprocess.Popen[bytes]) -> None:
    assert memory_limit_mb(Path(f"/proc/{limited.pid}")) == 300
