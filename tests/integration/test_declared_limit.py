"""With `enforce_declared`, a job's --mem is its own cgroup's hard limit: the kernel
kills that job alone when it grows past it, and the kill is told from its own counter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .conftest import Daemon
from .test_host_memory import hog

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]


def test_a_job_past_its_declared_memory_is_killed_and_a_job_within_it_is_not(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config="[host_memory]\nenforce_declared = true\n")
    release = d.root / "release"
    release.touch()  # each hog exits once it has touched its memory
    over = hog(d, 200, release, mem_mb=64, retries=0)
    within = hog(d, 32, release, mem_mb=256, retries=0)
    undeclared = hog(d, 200, release, retries=0)
    killed = d.wait_done(over, timeout=60)
    assert killed["state"] == "failed" and killed["reason"] == "oom_killed"
    assert killed["attempts"][0]["signal"] == 9
    assert killed["attempts"][0]["evidence"] == {"source": "job_cgroup_oom_kill"}
    assert d.wait_done(within)["state"] == "succeeded"
    assert d.wait_done(undeclared)["state"] == "succeeded"


def test_off_by_default_declared_memory_only_plans(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon()
    release = d.root / "release"
    release.touch()
    assert d.wait_done(hog(d, 200, release, mem_mb=64, retries=0))["state"] == "succeeded"
