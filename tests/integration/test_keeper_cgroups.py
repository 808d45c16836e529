"""A job's processes are its cgroup's: cancel kills all of them, the kernel's OOM counter
says whose job it killed, nothing is left a zombie, and no start runs unrecorded."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from supervisor.keeper import cgroup, spawn
from supervisor.keeper import jobs as jobs_module
from supervisor.keeper.journal import Journal

from .keeper_fixture import MEMCG, UNIFIED, alive, keeper, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]

# Every process ignores SIGTERM (an ignored signal stays ignored across exec), clears its
# environment and leaves the job's session: only the cgroup still knows them.
ESCAPING = (
    "trap '' TERM; "
    "env -i setsid sh -c 'sleep 1000 & sleep 1000 & wait' & "
    "env -i setsid sh -c 'setsid sleep 1000 & exit 0' & "
    "sleep 1000"
)


def _children(pid: int) -> list[int]:
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return found


def test_cancel_kills_a_tree_that_double_forked_and_left_its_session() -> None:
    with keeper() as k:
        assert k.v2 is not None, "no unified cgroup hierarchy"
        conn = k.connect()
        leader = conn.call("spawn", **k.job(1, ["sh", "-c", ESCAPING]))["job"]["pid"]
        pids = wait_for(
            lambda: len(p := conn.call("procs", job=1, attempt=1)["pids"]) >= 6 and p,
            "the whole tree in the job's cgroup",
        )
        assert any(os.getsid(p) != leader for p in pids if alive(p)), "nothing left the session"
        conn.call("kill", job=1, attempt=1, grace_s=0.2)  # answered once all are gone
        assert not [p for p in pids if alive(p)]
        assert (k.v2 / "job-1-1" / "cgroup.procs").read_text() == ""
        assert "populated 0" in (k.v2 / "job-1-1" / "cgroup.events").read_text()
        record = conn.call("list")["jobs"][0]
        assert record["signal"] == signal.SIGKILL  # the leader ignored SIGTERM


def test_a_stopped_job_takes_sigterm_at_once_instead_of_the_grace() -> None:
    with keeper() as k:
        conn = k.connect()
        pid = conn.call("spawn", **k.job(1, ["sleep", "1000"]))["job"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T", "stop")
        conn.call("kill", job=1, attempt=1, grace_s=3600)  # SIGKILL would come in an hour
        record = conn.call("list")["jobs"][0]
        assert record["signal"] == signal.SIGTERM


def test_orphans_are_reaped_at_once_and_no_zombie_is_left() -> None:
    with keeper() as k:
        conn = k.connect()
        # The leader exits first; its children are re-parented to the keeper and exit.
        script = "(sleep 0.2; exit 0) & (sleep 0.3; exit 1) & exit 0"
        conn.call("spawn", **k.job(1, ["sh", "-c", script]))
        keeper_pid = k.pid
        wait_for(lambda: conn.call("procs", job=1, attempt=1)["pids"] == [], "the orphans' exit")
        wait_for(lambda: _children(keeper_pid) == [], "the keeper to have no children")


def test_the_job_whose_oom_counter_moved_is_the_one_reported() -> None:
    if not (MEMCG / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller")
    with keeper(memcg_limit=300 * 1024 * 1024) as k:
        conn = k.connect()
        ready = k.home / "older-ready"
        older = (
            f"import time; x = bytearray(80 << 20); open({str(ready)!r}, 'w').close(); "
            "time.sleep(1000)"
        )
        newer = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"
        conn.call("spawn", **k.job(1, [sys.executable, "-c", older], oom_score_adj=0))
        wait_for(ready.exists, "the older job's memory")
        conn.call("spawn", **k.job(2, [sys.executable, "-c", newer], oom_score_adj=1000))
        while (ended := conn.event())["job"]["job"] != 2:
            pass
        record = ended["job"]
        assert record["signal"] == signal.SIGKILL and record["oom_kills"] >= 1
        assert record["peak_bytes"] > 200 * 1024 * 1024
        memory = conn.call("memory", job=1, attempt=1)
        assert memory["oom_kills"] == 0 and memory["peak_bytes"] >= 80 * 1024 * 1024
        assert conn.call("procs", job=1, attempt=1)["pids"], "the older job died too"
        conn.call("kill", job=1, attempt=1, grace_s=5)


def test_without_cgroups_the_session_and_the_tree_are_killed() -> None:
    with keeper(cgroups=False) as k:
        conn = k.connect()
        record = conn.call("spawn", **k.job(1, ["sh", "-c", "sleep 1000 & sleep 1000"]))["job"]
        assert record["cgroup"] is None and record["memcg"] is None
        pids = wait_for(
            lambda: len(p := conn.call("procs", job=1, attempt=1)["pids"]) == 3 and p, "tree"
        )
        conn.call("kill", job=1, attempt=1, grace_s=5)
        wait_for(lambda: not any(alive(p) for p in pids), "the tree to die")
        assert "no cgroup for jobs" in (k.home / "log").read_text()


def test_a_child_whose_start_was_never_recorded_never_runs_its_command(tmp_path: Path) -> None:
    """The keeper died between the fork and writing the start record: the gate's pipe
    closes, and the child exits without running anything."""
    marker = tmp_path / "ran"
    out = str(tmp_path / "out")
    spec = spawn.Spec(1, 1, ("touch", str(marker)), "/", {"PATH": "/usr/bin:/bin"}, out, out)
    null = os.open(os.devnull, os.O_WRONLY)
    forked = spawn.fork(spec, cgroup.Groups(), null, null)
    os.close(null)
    os.close(forked.status)
    os.close(forked.gate)  # as a dead keeper's would be
    _, status = os.waitpid(forked.pid, 0)
    assert os.WEXITSTATUS(status) == 127
    assert not marker.exists()


def test_a_spawn_is_answered_with_its_record_once_the_status_pipe_reads_eof(
    tmp_path: Path,
) -> None:
    """The gate opens as soon as the start is written; the answer waits for the exec,
    which closes the child's end of the status pipe."""
    marker, out = tmp_path / "ran", str(tmp_path / "out")
    jobs = jobs_module.Jobs(Journal(tmp_path / "journal"), cgroup.Roots(), lambda _: None)
    answers: list[dict[str, object]] = []
    spec = spawn.Spec(1, 1, ("touch", str(marker)), "/", {"PATH": "/usr/bin:/bin"}, out, out)
    live = jobs.spawn(spec, answers.append)
    assert live is not None and live.status_fd is not None and answers == []
    status_fd = live.status_fd
    wait_for(lambda: select.select([status_fd], [], [], 0)[0], "the exec")
    jobs.exec_outcome((1, 1))
    assert answers == [{"job": jobs.journal.records[(1, 1)].to_json()}]
    _, status = os.waitpid(jobs.journal.records[(1, 1)].pid, 0)
    assert os.WEXITSTATUS(status) == 0 and marker.exists()
    assert live.pidfd is not None
    os.close(live.pidfd)


THREADED = (
    "import threading, time\n"
    "for _ in range(8): threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n"
    "kept = b'x' * (256 << 20)  # its exit takes a while to give this back\n"
    "print('up', flush=True); time.sleep(100)\n"
)


def test_a_tree_is_removed_while_a_killed_process_with_threads_still_exits() -> None:
    """Its threads exit after cgroup.procs shows it gone, and hold the group until then
    (rmdir at once: EBUSY); the tree is removed all the same."""
    if not (UNIFIED / "cgroup.procs").exists():
        pytest.skip("no cgroup2 hierarchy here")
    for _ in range(3):
        group = UNIFIED / f"gpusv-test-{uuid.uuid4().hex[:10]}"
        (group / "inner").mkdir(parents=True)
        proc = subprocess.Popen([sys.executable, "-c", THREADED], stdout=subprocess.PIPE)
        try:
            (group / "inner" / "cgroup.procs").write_text(str(proc.pid))
            assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
            cgroup.remove_tree(group)
            assert not group.exists()
            assert proc.wait(timeout=10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if group.exists():
                cgroup.remove_tree(group)
