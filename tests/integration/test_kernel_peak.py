"""A job's recorded peak is its cgroup's high-water mark: a peak shorter than any
sampling interval is still recorded, and feeds the next run's projection."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from .conftest import Daemon

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]

# 300 MiB touched for a few milliseconds, then freed: the sampler (every 60 s here) never
# sees it.
BLIP = (
    "import time; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); del b\n"
    "time.sleep(0.5)"
)


def test_a_peak_between_two_samples_is_recorded(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(config="[host_memory]\nsample_interval_s = 60\n")
    job = d.submit(sys.executable, "-c", BLIP, retries=0)
    done = d.wait_done(job)
    assert done["state"] == "succeeded"
    assert done["attempts"][0]["peak_rss_mb"] >= 300
    dry = d.call(
        {
            "type": "submit",
            "argv": [sys.executable, "-c", BLIP],
            "cwd": str(d.root),
            "dry_run": True,
        }
    )
    assert dry["jobs"][0]["host_memory"]["projected_mb"] >= 300
