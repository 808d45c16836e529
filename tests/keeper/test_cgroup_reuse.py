"""A job's cgroup left holding processes (a start whose keeper died before the command
could run) is never waited for on the keeper's loop: what is in it is killed and the
start refused as a passing failure; once it is empty, the start goes through."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from supervisor.keeper import cgroup

UNIFIED = Path("/sys/fs/cgroup/unified")

pytestmark = pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(), reason="needs cgroup2")


def test_a_busy_job_cgroup_is_killed_and_the_start_refused_without_waiting() -> None:
    root = UNIFIED / f"gpusv-test-{uuid.uuid4().hex[:10]}"
    group = root / cgroup.name(7, 1)
    group.mkdir(parents=True)
    stray = subprocess.Popen(
        ["sh", "-c", f"echo $$ > {group}/cgroup.procs && exec sleep 300"],
    )
    try:
        deadline = time.monotonic() + 30
        while not (group / "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(cgroup.Busy, match="still holds processes"):  # not waited for
            cgroup.make(cgroup.Roots(str(root)), 7, 1, lambda message: None)
        stray.wait(timeout=30)  # killed by it
        made = cgroup.make(cgroup.Roots(str(root)), 7, 1, lambda message: None)
        assert made.v2 == str(group)
    finally:
        stray.kill()
        stray.wait()
        cgroup.remove_tree(root)


def test_a_vanished_root_is_made_again_and_a_group_that_cannot_be_made_refuses_the_job() -> None:
    root = UNIFIED / f"gpusv-test-{uuid.uuid4().hex[:10]}" / "keeper-gpu0"  # neither exists
    said: list[str] = []
    try:
        made = cgroup.make(cgroup.Roots(str(root)), 7, 1, said.append)
        assert made.v2 == str(root / cgroup.name(7, 1)) and (root / "cgroup.procs").exists()
        assert any("was missing: made again" in line for line in said)
        (root / cgroup.name(7, 1)).rmdir()
        (root / "cgroup.max.descendants").write_text("0")
        with pytest.raises(cgroup.Unavailable) as refused:
            cgroup.make(cgroup.Roots(str(root)), 7, 2, said.append)
        assert refused.value.code == "cgroup"
        assert str(refused.value).startswith(f"cannot make cgroup {root}/job-7-2: ")
        assert said[-1] == f"job refused: {refused.value}"
    finally:
        for path in (root / cgroup.name(7, 1), root, root.parent):
            if path.exists():
                path.rmdir()
