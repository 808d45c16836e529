"""SIGHUP reloads what can change while jobs run, and never stops the daemon."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from supervisor.client.connection import Refused

from .conftest import Daemon

pytestmark = pytest.mark.integration


def test_sighup_reloads_the_config_and_the_daemon_serves_on(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None)
    assert d.proc is not None
    job = d.submit("sleep", "120", gpus=0)
    d.wait_state(job, "running")

    d.config.write_text(
        "max_queued_per_user = 1\nlog_job_lines_per_s = 1\nstate_dir = '/elsewhere'\n"
    )
    d.proc.send_signal(signal.SIGHUP)
    d.wait_for(lambda: "SIGHUP: config reloaded" in d.log_text(), what="the reload logged")
    reloaded = next(line for line in d.log_text().splitlines() if "config reloaded" in line)
    applied = reloaded.split("needs_restart=")[0]
    assert "max_queued_per_user" in applied and "log_job_lines_per_s" in applied
    assert "state_dir" in d.log_text()
    with pytest.raises(Refused) as refused:  # applied: one active job is the limit now
        d.submit("true", gpus=0)
    assert refused.value.code == "limit"

    d.config.write_text("no_such_key = 1\n")
    d.proc.send_signal(signal.SIGHUP)
    d.wait_for(lambda: "config not reloaded" in d.log_text(), what="the bad config logged")
    assert d.proc.poll() is None
    assert d.call({"type": "ping"})["ok"]
    assert d.show(job)["state"] == "running"  # the job was never touched
    assert d.stop() == 0
