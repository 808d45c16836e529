"""A stop is an intent committed before it is acknowledged: a cancel or a `--time` stop
that gpusvd acknowledged survives gpusvd's death during the kill grace. The next daemon
stops the job with what is left of the grace, and the job ends as the stop said, never
run again."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from .conftest import Daemon
from .keeper_fixture import alive

pytestmark = pytest.mark.root("job cgroups need root")

STUBBORN = "trap '' TERM; echo up; while :; do sleep 0.2; done"  # outlives SIGTERM
GRACE = 4


@pytest.mark.parametrize("retries", [3, 0])
def test_an_acknowledged_cancel_ends_cancelled_through_a_crash_in_its_kill_grace(
    make_daemon: Callable[..., Daemon], retries: int
) -> None:
    d = make_daemon(gpus="1x8G", config=f"[jobs]\nkill_grace_s = {GRACE}\n")
    job = d.submit("sh", "-c", STUBBORN, gpus=1, retries=retries)
    pid = d.wait_pid(job)
    reply = d.call({"type": "cancel", "ids": [job]})
    assert reply["results"] == [{"id": job, "ok": True, "state": "cancelling"}]
    d.kill9()  # within the grace: the job still runs, SIGTERM ignored
    assert alive(pid)
    began = time.monotonic()
    d.start()
    done = d.wait_done(job)
    print(f"cancel carried through the restart: ended {time.monotonic() - began:.1f}s after")
    assert (done["state"], done["reason"]) == ("cancelled", "cancelled")
    assert [a["n"] for a in done["attempts"]] == [1]  # nothing ran again
    assert done["attempts"][0]["pid"] == pid
    d.wait_for(lambda: not alive(pid), what="the cancelled job's process to be gone")


def test_a_time_limit_stop_ends_as_timeout_through_a_crash_in_its_kill_grace(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=f"[jobs]\nkill_grace_s = {GRACE}\n")
    job = d.submit("sh", "-c", STUBBORN, gpus=1, time_limit_s=1)
    pid = d.wait_pid(job)
    d.wait_for(
        lambda: d.show(job)["attempts"][0].get("stopping") == "timeout",
        what="the time limit's stop to be committed",
    )
    d.kill9()
    assert alive(pid)
    d.start()
    done = d.wait_done(job)
    assert (done["state"], done["reason"]) == ("failed", "timeout")
    assert [a["n"] for a in done["attempts"]] == [1]
    d.wait_for(lambda: not alive(pid), what="the stopped job's process to be gone")
