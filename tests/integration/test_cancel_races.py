"""A cancel that races the start: through the real socket, on idle cards, the cancel sent
0-5 ms after the submit was acknowledged. Every acknowledged cancel ends `cancelled`, and
no process of the job is alive kill_grace_s after the reply."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.integration.conftest import Daemon

RACES = 300
GRACE_S = 0.5  # kill_grace_s: a job's tree gets SIGKILL this long after SIGTERM


class Line:
    """One connection, one request at a time: the cancel leaves as soon as the ack came."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buf = b""

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        assert reply.get("ok"), reply
        return reply

    def close(self) -> None:
        self.sock.close()


def processes_of(root: Path, job_ids: set[int]) -> list[tuple[int, int]]:
    """(job id, pid) of every live process started for one of these jobs of this daemon."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("GPUSV_TEST_ROOT") != str(root) or "GPUSV_JOB_ID" not in env:
                continue
            job_id = int(env["GPUSV_JOB_ID"])
            if job_id in job_ids and proc.status() != psutil.STATUS_ZOMBIE:
                found.append((job_id, proc.pid))
        except (psutil.Error, ValueError):
            continue
    return found


def check_due(root: Path, due: list[tuple[float, int]], now: float) -> list[tuple[float, int]]:
    """Assert that no process runs of the jobs whose time has come; return the others."""
    ready = {job_id for t, job_id in due if t <= now}
    if ready:
        assert processes_of(root, ready) == [], "a cancelled job runs on"
    return [(t, job_id) for t, job_id in due if t > now]


def test_every_acknowledged_cancel_ends_cancelled_and_nothing_of_it_runs_on(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(gpus="2x8G", config=f"cpu_slots = 2\n[jobs]\nkill_grace_s = {GRACE_S}\n")
    line = Line(d.socket)
    rng = random.Random(11)
    env = {"PATH": "/usr/bin:/bin", "GPUSV_TEST_ROOT": str(d.root)}
    replies: dict[str, int] = {}
    due: list[tuple[float, int]] = []  # (reply + kill_grace_s, job id), checked once passed
    try:
        for i in range(RACES):
            request = {
                "type": "submit",
                "argv": ["sleep", "5"],
                "cwd": str(d.root),
                "env": env,
                "gpus": 0 if i % 3 == 0 else 1,
            }
            job_id = int(line.call(request)["ids"][0])
            time.sleep(rng.uniform(0.0, 0.005))
            (result,) = line.call({"type": "cancel", "ids": [job_id]})["results"]
            due.append((time.monotonic() + GRACE_S, job_id))
            assert result["ok"] and result["state"] in ("cancelled", "cancelling"), result
            replies[result["state"]] = replies.get(result["state"], 0) + 1
            # The next race starts on idle cards: this job's end is recorded first.
            (job,) = line.call({"type": "wait", "ids": [job_id], "timeout_s": 30})["jobs"]
            assert (job["state"], job["reason"]) == ("cancelled", "cancelled"), job
            due = check_due(d.root, due, time.monotonic())
        time.sleep(max(0.0, max((t for t, _ in due), default=0.0) - time.monotonic()))
        assert check_due(d.root, due, float("inf")) == []
    finally:
        line.close()
    # How often the cancel found nothing started ("cancelled") or an attempt to stop.
    print(f"cancel replies over {RACES} races: {replies}")
    assert sum(replies.values()) == RACES
