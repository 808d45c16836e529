"""Real processes for the tests of what gpusvd writes to a job's processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Six live processes, killed after the test."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(6)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()
