"""gpusvd inside a memory-limited cgroup (a Slurm job, a pod) sizes its ledger by it."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable

import pytest

from .conftest import Daemon
from .test_host_memory import memory_cgroup

GIB = 1 << 30


@pytest.mark.root("creating a memory cgroup needs root")
def test_a_daemon_in_a_2_gib_cgroup_projects_against_2_gib(
    make_daemon: Callable[..., Daemon],
) -> None:
    assert os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 4 * GIB
    with memory_cgroup(2048) as cgroup:
        d = make_daemon(start=False)
        wrapper = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
        with open(d.log, "ab") as log:
            d.proc = subprocess.Popen(
                ["sh", "-c", wrapper, "sh", *d.argv()], stdout=log, stderr=log, env=d.env
            )
        d.wait_ready()
        text = d.call({"type": "metrics"})["text"]
        limit = re.search(r"^gpusv_host_memory_limit_bytes ([0-9.e+]+)$", text, re.M)
        assert limit is not None, text
        assert float(limit.group(1)) == 2 * GIB
        # Beside a running job, one declared past the allocation waits rather than start
        # into the cgroup's OOM killer (the host has RAM enough for it).
        first = d.submit("sleep", "300", mem_mb=100)
        d.wait_state(first, "running")
        job = d.submit("true", mem_mb=3 * 1024)
        held = d.wait_for(lambda: (j := d.show(job))["waiting_for"] and j, what="a hold")
        assert "host RAM" in held["waiting_for"]
        d.cli("cancel", str(first), str(job))
        d.stop()
