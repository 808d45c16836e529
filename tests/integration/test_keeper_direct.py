"""posix_spawn starts (keeper/direct.py) for real: what the job is born with, what the
keeper is left with, and the crash between a start's record and its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper import cgroup, direct
from supervisor.keeper.client import Connection
from supervisor.keeper.spawn import Spec

from .keeper_fixture import keeper

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root here"),
]

REPORT = (
    "cat /proc/self/cgroup; echo adj=$(cat /proc/self/oom_score_adj); echo cwd=$(pwd); "
    "grep -E '^Sig(Ign|Blk)' /proc/self/status; echo sid=$(ps -o sid= -p $$); echo pid=$$; "
    "echo fds=$(ls /proc/$$/fd | tr '\\n' ' ')"
)


def _exit_event(conn: Connection) -> dict[str, Any]:
    while True:
        message = conn.event()
        if message.get("event") == "exit":
            job: dict[str, Any] = message["job"]
            return job


def _field(line: str) -> tuple[str, str]:
    """A `key=value` line as its key and value; any other as its first `:` field and
    the whole line."""
    if "=" in line:
        key, value = line.split("=", 1)
        return key, value
    return line.split(":", 1)[0], line


def _state(pid: int) -> tuple[str, str, str]:
    with open(f"/proc/{pid}/cgroup") as fh, open(f"/proc/{pid}/oom_score_adj") as adj:
        return fh.read(), adj.read(), os.readlink(f"/proc/{pid}/cwd")


def test_a_job_is_born_in_its_cgroups_with_its_setup_and_the_keeper_keeps_its_own(
    tmp_path: Path,
) -> None:
    with keeper() as k:
        conn = k.connect()  # answered once the keeper serves: after its probe
        assert "start with posix_spawn" in (k.home / "log").read_text()
        before = _state(k.pid)
        spec = k.job(1, ["sh", "-c", REPORT], cwd=str(tmp_path), oom_score_adj=700)
        record = conn.call("spawn", **spec)["job"]
        assert _exit_event(conn)["exit_code"] == 0, k.output(1)
        out = dict(_field(line) for line in k.output(1).splitlines())
        assert k.v2 is not None
        assert f"0::/{k.v2.name}/job-1-1" in k.output(1)
        if k.memcg is not None:
            assert f"memory:/{k.memcg.name}/job-1-1" in k.output(1)
        assert out["adj"] == "700"
        assert out["cwd"] == str(tmp_path)
        ignored = int(out["SigIgn"].split()[-1], 16)  # Python's own ignored: default again
        assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))
        assert out["SigBlk"].split()[-1] == "0000000000000000"
        assert int(out["sid"]) == int(out["pid"]) == record["pid"]  # a session of its own
        assert set(out["fds"].split()) <= {"0", "1", "2", "3"}  # 3: ls's own directory
        assert _state(k.pid) == before  # cgroups, oom_score_adj, working directory


def test_a_job_started_so_obeys_its_memory_limit() -> None:
    """The limit is written once the keeper is out of the cgroup: it holds all the same."""
    with keeper() as k:
        conn = k.connect()
        limit = 64 * 2**20
        conn.call("spawn", **k.job(1, ["sleep", "1000"], mem_max=limit))
        memcg = k.memcg / "job-1-1" if k.memcg is not None else None
        v2 = k.v2 / "job-1-1" if k.v2 is not None else None
        if v2 is not None and (v2 / "memory.max").exists():
            assert (v2 / "memory.max").read_text().strip() == str(limit)
        elif memcg is not None:
            assert (memcg / "memory.limit_in_bytes").read_text().strip() == str(limit)
        else:
            pytest.skip("no memory controller for job cgroups here")
        conn.call("kill", job=1, attempt=1, grace_s=1)


def test_a_keeper_killed_between_the_record_and_the_pid_leaves_nothing_running() -> None:
    """The record names the cgroup before the process exists; the pid follows. A keeper
    that died in between leaves a record with pid 0 and a process in that cgroup: the
    next keeper empties the cgroup and records the attempt lost."""
    with keeper() as k:
        assert k.v2 is not None
        k.kill()
        group = k.v2 / "job-4-1"
        group.mkdir()
        stray = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        try:
            (group / "cgroup.procs").write_text(str(stray.pid))
            line = {
                "e": "start",
                "job": 4,
                "attempt": 1,
                "pid": 0,
                "start_ticks": 0,
                "started_at": time.time(),
                "cgroup": str(group),
                "memcg": None,
            }
            with open(k.home / "journal", "a") as journal:
                journal.write(json.dumps(line) + "\n")
            k.start()
            (found,) = k.connect().call("list")["jobs"]
            assert (found["job"], found["lost"], found["pid"]) == (4, True, 0)
            assert stray.wait(timeout=10) == -signal.SIGKILL
            assert cgroup.pids(cgroup.Groups(str(group))) == []
        finally:
            if stray.poll() is None:
                stray.kill()
                stray.wait()


def test_a_cgroup_that_cannot_be_joined_fails_the_start_before_anything_runs() -> None:
    home = direct.Home([], os.open("/", os.O_RDONLY | os.O_DIRECTORY), -1, 0)
    spec = Spec(1, 1, ("true",), "/", {}, "/dev/null", "/dev/null")
    with pytest.raises(direct.Failed, match="cannot join its cgroup"):
        home.start(spec, cgroup.Groups("/nonexistent/job-1-1"), 1, 2, 0)
    os.close(home.cwd)


def test_a_probe_group_left_by_a_keeper_killed_while_it_probed_is_removed() -> None:
    """A keeper tries a cgroup under each root at its start; one killed in that moment
    leaves the group behind. The next keeper of the home removes it (and probes its own),
    and whoever throws the roots away removes one too."""
    with keeper() as k:
        roots = [root for root in (k.v2, k.memcg) if root is not None]
        assert roots, "the unified hierarchy is here"
        k.kill()
        for root in roots:
            (root / "probe-999999").mkdir()
        k.start()
        assert [r for r in roots if (r / "probe-999999").exists()] == []
        k.connect()  # answered once serving: its own probe is over
        assert [p.name for r in roots for p in r.iterdir() if p.is_dir()] == []
        k.kill()
        for root in roots:
            (root / "probe-999998").mkdir()
            (root / "job-7-1").mkdir()
            cgroup.remove_tree(root)
            assert not root.exists()
