"""Jobs' output through the keeper's relay, end to end: both streams in the order they
were written, a full disk that costs output and never the job, and why a job that could
not start did not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from .conftest import Daemon

pytestmark = pytest.mark.integration

# Prints to stdout, waits until its keeper has written that line to the job's file (so
# the order is the job's, not a race with the relay), then raises.
PRINT_THEN_RAISE = """
import os, time
logs = os.path.join(os.environ["GPUSV_TEST_ROOT"], "state", "logs")
out = os.path.join(logs, os.environ["GPUSV_JOB_ID"] + ".out")
print("before the fall", flush=True)
while b"before the fall" not in (open(out, "rb").read() if os.path.exists(out) else b""):
    time.sleep(0.01)
raise ValueError("boom")
"""


def test_a_job_that_prints_then_raises_shows_both_in_order(daemon: Daemon) -> None:
    job = daemon.submit(sys.executable, "-c", PRINT_THEN_RAISE, retries=0, gpus=0)
    assert daemon.wait_done(job)["reason"] == "exit_nonzero"
    lines = daemon.cli("logs", str(job)).stdout.splitlines()
    assert lines[0] == "before the fall"
    assert lines[1] == "[stderr] Traceback (most recent call last):"  # not a terminal: marked
    assert lines[-1] == "[stderr] ValueError: boom"
    objs = [json.loads(x) for x in daemon.cli("logs", "--json", str(job)).stdout.splitlines()]
    assert objs[0] == {"stream": "stdout", "line": "before the fall"}
    assert objs[-1] == {"stream": "stderr", "line": "ValueError: boom"}
    assert daemon.cli("logs", "--stdout", str(job)).stdout == "before the fall\n"
    assert daemon.cli("logs", "--stderr", str(job)).stdout.endswith("ValueError: boom\n")
    assert daemon.cli("logs", "--tail", "1", str(job)).stdout == "[stderr] ValueError: boom\n"


def test_a_job_that_writes_nothing_makes_no_file_and_its_logs_are_empty(daemon: Daemon) -> None:
    quiet = daemon.submit("true", gpus=0)
    loud = daemon.submit("sh", "-c", "echo out; echo err >&2", gpus=0)
    daemon.wait_done(quiet)
    daemon.wait_done(loud)
    logs = daemon.state / "logs"
    assert sorted(p.name for p in logs.glob(f"{quiet}.*")) == []
    assert sorted(p.name for p in logs.glob(f"{loud}.*")) == [
        f"{loud}.{s}" for s in ["err", "idx", "out"]
    ]
    for form in ([], ["--stdout"], ["--stderr"], ["--json"], ["--tail", "3"], ["--follow"]):
        shown = daemon.cli("logs", *form, str(quiet))
        assert (shown.returncode, shown.stdout) == (0, ""), form
    assert (logs / "newest-id").read_text() == f"{max(quiet, loud):020d}\n"


def test_show_and_wait_say_why_a_job_could_not_start(daemon: Daemon) -> None:
    job = daemon.submit("no-such-program-here", gpus=0)
    waited = daemon.cli("wait", str(job), check=False)
    assert waited.returncode == 125
    assert "executable not found: no-such-program-here" in waited.stdout
    shown = daemon.cli("show", str(job)).stdout
    assert "spawn_failed: executable not found: no-such-program-here" in shown
    run = daemon.cli("submit", "--wait", "--gpus", "0", "--", "no-such-program-here", check=False)
    assert run.returncode == 125 and "executable not found" in run.stderr


@pytest.fixture
def full_logs(make_daemon: Callable[..., Daemon]) -> Iterator[Daemon]:
    """A daemon whose jobs' output directory is a tiny tmpfs, filled to the last page."""
    d = make_daemon(gpus=None, start=False)
    logs = d.state / "logs"
    logs.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(logs)], check=True)
    try:
        fd = os.open(logs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield d.start()
    finally:
        if d.proc is not None:
            d.stop()
        subprocess.run(["umount", "-l", str(logs)], check=False)


@pytest.mark.root("mounts a tiny tmpfs for the jobs' output files")
def test_output_past_a_full_disk_is_dropped_and_counted_and_the_job_succeeds(
    full_logs: Daemon,
) -> None:
    d = full_logs
    size = 200_000
    script = f"import sys\nsys.stdout.write('x' * {size})\nsys.stderr.write('e' * 10)\n"
    job = d.submit(sys.executable, "-c", script, retries=0, gpus=0)
    done = d.wait_done(job)
    assert done["state"] == "succeeded", done
    assert done["output_dropped_bytes"] == size + 10
    assert done["attempts"][-1]["output_dropped_bytes"] == size + 10
    (event,) = [e for e in done["events"] if e["kind"] == "output_dropped"]
    assert event["bytes"] == size + 10 and str(size + 10) in event["message"]
    assert f"{size + 10} bytes" in d.cli("show", str(job)).stdout
    os.unlink(d.state / "logs" / "filler")  # room again: the next job's output is kept
    again = d.submit("echo", "kept", retries=0, gpus=0)
    assert d.wait_done(again)["state"] == "succeeded"
    assert d.cli("logs", str(again)).stdout == "kept\n"
    assert "output_dropped_bytes" not in d.show(again) or d.show(again)["output_dropped_bytes"] == 0


def test_a_retry_follows_on_in_one_log_with_its_header(daemon: Daemon) -> None:
    job = daemon.submit(
        "sh", "-c", "echo out $GPUSV_ATTEMPT; echo err >&2; exit 1", retries=1, gpus=0
    )
    daemon.wait_done(job)
    text = daemon.cli("logs", str(job)).stdout
    assert text.count("[stderr] err\n") == 2
    assert "out 1\n" in text and "out 2\n" in text
    assert text.index("out 1") < text.index("attempt 2") < text.index("out 2")
