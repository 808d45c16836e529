"""The host-RAM gate as its users meet it: a default key that builds a history, one
reason and one queue_wait for a whole hold, and only successful runs in the figure."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .conftest import Daemon

# Allocate and touch N MiB (--mb, default 300), hold it until $RELEASE exists, then exit
# with $EXIT. Every other argument (a seed) is a parameter: it does not change the key.
TRAIN = """\
import argparse, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=0)
p.add_argument("--mb", type=int, default=300)
a = p.parse_args()
b = bytearray(a.mb << 20)
b[::4096] = b"x" * len(b[::4096])
time.sleep(0.6)
while not os.path.exists(os.environ.get("RELEASE", "/")):
    time.sleep(0.05)
sys.exit(int(os.environ.get("EXIT", "0")))
"""

CONFIG = """
cpu_slots = 2
[host_memory]
limit = "600M"
reserve = "10M"
sample_interval_s = 0.1
max_backfill_wait_s = 0
"""


def train(d: Daemon, *args: str, release: Path | None = None, **opts: Any) -> int:
    script = d.root / "train.py"
    if not script.exists():
        script.write_text(TRAIN)
    env = {"RELEASE": str(release)} if release else {}
    env.update(opts.pop("env", {}))
    return d.submit(sys.executable, "train.py", *args, env=env, **opts)


def waits(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in job["events"] if e["kind"] == "queue_wait"]


def peak(d: Daemon, job_id: int) -> int:
    attempts = d.show(job_id)["attempts"]
    return int(attempts[-1]["peak_rss_mb"] or 0) if attempts else 0


def projected(d: Daemon, *args: str) -> int | None:
    out = d.cli("submit", "--dry-run", "--json", "--", sys.executable, "train.py", *args)
    job = json.loads(out.stdout)
    memory = job["host_memory"]
    return None if memory is None else int(memory["projected_mb"])


def test_the_seed_case_one_heavy_runs_one_is_held_and_a_never_run_job_takes_the_card(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G", config=CONFIG)
    seed = train(d, "--seed", "1")
    assert d.wait_done(seed)["state"] == "succeeded"  # the key now has a figure
    release, other = d.root / "release", d.root / "release-other"
    first = train(d, "--seed", "2", release=release)
    d.wait_state(first, "running")
    second = train(d, "--seed", "3", release=release)  # no flag: the default key gates it
    held = d.wait_for(lambda: (j := d.show(second))["waiting_for"] and j, what="a hold")
    assert held["mem_key"] == d.show(first)["mem_key"] == d.show(seed)["mem_key"]
    assert held["waiting_for"].startswith("waiting for host RAM: needs ~")
    # A never-run job (no figure) backfills onto the idle card, though the held job has
    # waited past max_backfill_wait_s: it takes none of the RAM that job waits for.
    never = d.submit("sh", "-c", f"while [ ! -e {other} ]; do sleep 0.05; done")
    d.wait_state(never, "running")
    gpus = json.loads(d.cli("gpus", "--json").stdout)
    assert sorted(len(g["running_jobs"]) for g in gpus) == [1, 1]  # no card is idle now
    time.sleep(0.5)  # several passes with the hold in place and no card idle
    shown = d.show(second)
    listed = {j["id"]: j for j in json.loads(d.cli("list", "--json").stdout)}
    assert shown["waiting_for"].startswith("waiting for host RAM: needs ~")
    assert listed[second]["waiting_for"] == shown["waiting_for"]
    assert [e["reason"] for e in waits(shown)] == ["host_ram"]
    release.touch()
    assert d.wait_done(first)["state"] == "succeeded"
    done = d.wait_done(second)
    assert done["state"] == "succeeded"
    assert [e["reason"] for e in waits(done)] == ["host_ram"]  # one wait, one event
    other.touch()
    assert d.wait_done(never)["state"] == "succeeded"


def test_failed_and_cancelled_runs_leave_the_figure_an_oom_floor_is_kept(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="1x8G", config=CONFIG)
    assert d.wait_done(train(d, "--mb", "100"))["state"] == "succeeded"
    figure = projected(d, "--mb", "9")
    assert figure is not None and 100 <= figure < 200
    failed = train(d, "--mb", "250", env={"EXIT": "1"}, retries=0)
    assert d.wait_done(failed)["reason"] == "exit_nonzero"
    assert projected(d, "--mb", "9") == figure  # a failed run's peak does not count
    release = d.root / "never"
    cancelled = train(d, "--mb", "250", release=release)
    d.wait_for(lambda: peak(d, cancelled) >= 250, what="the run to reach its peak")
    d.cli("cancel", str(cancelled))
    assert d.wait_done(cancelled)["state"] == "cancelled"
    assert projected(d, "--mb", "9") == figure  # nor does a cancelled one's
