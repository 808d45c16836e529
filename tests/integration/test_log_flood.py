"""A flood of short jobs: the daemon's log keeps to `log_job_lines_per_s` routine job
lines a second and sums up the rest, and still logs every failure."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest

from .conftest import Daemon

pytestmark = pytest.mark.integration

JOBS = 80


def _counts(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"\b(\w+)=(\d+)\b", line)}


def test_routine_lines_are_capped_and_summed_up_and_failures_all_logged(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None, config="log_job_lines_per_s = 2\ncpu_slots = 2\n")
    env = {"PATH": os.environ["PATH"]}
    reply = d.call(
        {
            "type": "submit_batch",
            "argvs": [["true"]] * JOBS,
            "cwd": str(d.root),
            "env": env,
            "gpus": 0,
        }
    )
    failing = d.submit("sh", "-c", "exit 3", gpus=0, retries=0)
    for job_id in [*reply["ids"], failing]:
        d.wait_done(job_id, timeout=60)

    def tally() -> tuple[int, list[dict[str, int]]] | None:
        """The successes logged and the seconds' sums, once they add up to every job
        (the last second's sum comes once that second is over)."""
        lines = d.log_text().splitlines()
        shown = sum(
            1 for line in lines if "event_kind=exited" in line and "state=succeeded" in line
        )
        left_out = [_counts(line) for line in lines if "routine job lines left out" in line]
        done = shown + sum(c.get("exited", 0) for c in left_out) == JOBS
        return (shown, left_out) if done else None

    shown, left_out = d.wait_for(tally, what="every success logged or summed up")
    assert shown < JOBS, "a flood of two lines a job went to the log whole"
    assert all(
        c["left_out"] == sum(v for k, v in c.items() if k not in ("left_out", "per_s"))
        for c in left_out
    )
    lines = d.log_text().splitlines()
    assert any(f"job_id={failing}" in line and "event_kind=exited" in line for line in lines)
