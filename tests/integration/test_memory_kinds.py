"""The default memory key as a user meets it: an encode batch, with no --mem-key, builds
one history from its first half, and the ledger holds its second half by that figure; a
need above the host's limit is told at submit and still runs alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .conftest import Daemon

# An "encode": touches MB MiB, then holds it while ./hold exists. Its file arguments
# (input, output) are what changes from one job of the batch to the next.
HOG = """\
import os, sys, time
MB = 150
b = bytearray(MB << 20)
b[::4096] = b"x" * len(b[::4096])
time.sleep(0.3)
while os.path.exists("hold"):
    time.sleep(0.05)
open(sys.argv[2], "w").write(sys.argv[1])
"""

# 490 MiB for jobs: two encodes (~160 MiB each with the margin) fit, a third does not.
CONFIG = """
cpu_slots = 4
[host_memory]
limit = "500M"
reserve = "10M"
sample_interval_s = 0.1
"""


def batch(d: Daemon, name: str, *inputs: str) -> list[int]:
    (d.root / name).write_text("".join(f"python3 hog.py in/{i}.mp4 out/{i}.mkv\n" for i in inputs))
    out = d.cli("submit", "--gpus", "0", "--batch", name).stdout
    return [int(line) for line in out.split()]


def dry_run(d: Daemon, *argv: str) -> dict[str, Any]:
    job: dict[str, Any] = json.loads(
        d.cli("submit", "--gpus", "0", "--dry-run", "--json", "--", *argv).stdout
    )
    return job


def test_an_encode_batch_second_half_is_held_by_the_first_halfs_peaks(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None, config=CONFIG)
    (d.root / "hog.py").write_text(HOG)
    (d.root / "in").mkdir()
    (d.root / "out").mkdir()
    first = batch(d, "first.txt", "a", "b")
    assert all(d.wait_done(j)["state"] == "succeeded" for j in first)
    keys = {d.show(j)["mem_key"] for j in first}
    assert len(keys) == 1  # one kind of job, with no --mem-key
    [key] = keys
    assert key.startswith("python3") and "hog.py *.mp4 *.mkv#" in key

    # The same program by its absolute path, another file: the same key, its two runs.
    job = dry_run(d, "python3", str(d.root / "hog.py"), "in/z.mp4", "out/z.mkv")
    assert job["mem_key"] == key
    memory = job["host_memory"]
    assert memory["basis"] == "observed" and memory["runs"] == 2
    assert memory["peak_mb"] >= 150
    # Another codec option is another kind: no history.
    other = dry_run(d, "python3", "hog.py", "-c:v", "libx265", "in/z.mp4", "out/z.mkv")
    assert other["mem_key"] != key and other["host_memory"] is None
    # A declared --mem above the history wins, and says so.
    declared = json.loads(
        d.cli(
            "submit", "--gpus", "0", "--mem", "300M", "--dry-run", "--json",
            "--", "python3", "hog.py", "in/y.mp4", "out/y.mkv",
        ).stdout
    )  # fmt: skip
    assert declared["host_memory"]["basis"] == "declared"
    assert declared["host_memory"]["projected_mb"] == 300
    assert declared["host_memory"]["runs"] == 2

    (d.root / "hold").touch()
    second = batch(d, "second.txt", "c", "d", "e", "f")

    def two_run_two_wait() -> list[dict[str, Any]] | None:
        jobs = [d.show(j) for j in second]
        running = [j for j in jobs if j["state"] == "running"]
        held = [j for j in jobs if (j["waiting_for"] or "").startswith("waiting for host RAM")]
        return jobs if len(running) == 2 and len(held) == 2 else None

    jobs = d.wait_for(two_run_two_wait, what="two encodes running, two held for host RAM")
    assert {j["mem_key"] for j in jobs} == {key}
    text = d.cli("show", str(jobs[-1]["id"])).stdout
    assert f"memory key   {key}" in text
    assert "(observed: 2 earlier runs peaked at" in text
    (d.root / "hold").unlink()
    assert all(d.wait_done(j)["state"] == "succeeded" for j in second)


def test_a_need_above_the_limit_is_told_at_submit_and_runs_alone(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus=None, config=CONFIG)
    dry = d.cli("submit", "--gpus", "0", "--mem", "2G", "--dry-run", "--", "true")
    assert "gpusv: warning: needs ~2 GiB of host RAM (declared with --mem)" in dry.stderr
    done = d.cli("submit", "--gpus", "0", "--mem", "2G", "--", "true")
    job_id = int(done.stdout)
    assert f"gpusv: warning: job {job_id}: needs ~2 GiB" in done.stderr
    assert "it will start only when no other job runs" in done.stderr
    job = d.wait_done(job_id)
    assert job["state"] == "succeeded"  # alone: the lone-job rule
    [note] = [e for e in job["events"] if e["kind"] == "mem_over_limit"]
    assert note["projected_mb"] == 2048 and note["basis"] == "declared"
