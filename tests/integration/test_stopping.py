"""A job being stopped says so (`stopping`) until its processes are gone; a stopped
(SIGSTOP) job takes SIGTERM at once instead of waiting out the grace."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Daemon

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]

LONG_GRACE = "[jobs]\nkill_grace_s = 600\n"


def test_a_job_that_ignores_sigterm_shows_stopping_until_it_is_gone(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config=LONG_GRACE)
    job = d.submit("sh", "-c", "trap '' TERM; exec sleep 1000")  # SIG_IGN survives exec
    pid = d.wait_pid(job)
    assert d.show(job)["stopping"] is False
    assert d.cli("cancel", str(job)).returncode == 0
    shown = d.wait_for(lambda: (j := d.show(job))["stopping"] and j, what="stopping")
    assert shown["state"] == "running"  # the contract's states are unchanged
    assert "stopping" in d.cli("show", str(job)).stdout.splitlines()[1]
    (row,) = [r for r in d.cli("list").stdout.splitlines()[1:] if r.split()[0] == str(job)]
    assert row.split()[1] == "stopping"
    listed = json.loads(d.cli("list", "--json").stdout)
    assert [j["stopping"] for j in listed if j["id"] == job] == [True]
    os.kill(pid, signal.SIGKILL)  # what the grace would do in ten minutes
    done = d.wait_done(job)
    assert done["state"] == "cancelled" and done["stopping"] is False


def test_cancelling_a_stopped_job_ends_it_with_sigterm_not_after_the_grace(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config=LONG_GRACE)
    job = d.submit("sleep", "1000")
    pid = d.wait_pid(job)
    os.kill(pid, signal.SIGSTOP)
    stat = Path(f"/proc/{pid}/stat")
    d.wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", what="stopped")
    d.cli("cancel", str(job))
    done = d.wait_done(job)  # well inside the 600 s grace
    assert done["state"] == "cancelled"
    assert done["attempts"][-1]["signal"] == signal.SIGTERM
