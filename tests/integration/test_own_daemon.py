"""A user's own gpusvd, run by an ordinary user: where it keeps its state and socket, who
may reach it, and what it knows of its jobs without a cgroup (the sampler's peak, the
kernel log's OOM lines, the oom_score_adj floor it inherited)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.daemon.cgroups import unified_mount
from supervisor.keeper.cgroup import remove_tree
from supervisor.wire import protocol

from .conftest import AS_A_USER, Daemon
from .unprivileged import OOM_FLOOR, OwnDaemon, OwnUser

pytestmark = [pytest.mark.integration, pytest.mark.root(AS_A_USER)]

# 300 MiB touched and held for 1.5 s, freed, then 1.5 s at a few MiB: the tail is what
# the last sample sees, the peak only what the largest one did.
SPIKE = (
    "import time; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096])\n"
    "time.sleep(1.5); del b; time.sleep(1.5)"
)


def own(make_own_daemon: Callable[..., Daemon], **kw: object) -> OwnDaemon:
    d = make_own_daemon(**kw)
    assert isinstance(d, OwnDaemon)
    return d


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_a_users_gpusvd_keeps_its_state_and_socket_in_the_users_own_directories(
    make_own_daemon: Callable[..., Daemon],
) -> None:
    d = own(make_own_daemon, gpus="1x8G")
    user = d.user
    assert d.proc is not None
    assert psutil.Process(d.proc.pid).uids().effective == user.uid  # setpriv execs
    sock = d.socket.stat()
    assert stat.S_ISSOCK(sock.st_mode) and sock.st_mode & 0o777 == 0o660
    assert (sock.st_uid, sock.st_gid) == (user.uid, user.gid)
    assert (d.state / "state.db").stat().st_uid == user.uid
    assert d.state.stat().st_mode & 0o777 == 0o700

    done = d.cli("submit", "--gpus", "0", "--wait", "--", "sh", "-c", "id -u")  # no --socket
    job = int(done.stdout.split()[0])
    assert d.cli("logs", str(job)).stdout.strip() == str(user.uid)

    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    stranger = subprocess.run(
        [*nobody, d.python, "-m", "supervisor.client.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": d.env["PATH"],
            "PYTHONPATH": d.env["PYTHONPATH"],
            "GPUSV_SOCKET": str(d.socket),
        },
        cwd="/",
    )
    assert stranger.returncode == 3 and "permission denied" in stranger.stderr, stranger.stderr
    assert str(d.socket) in stranger.stderr
    with pytest.raises(Exception) as info:  # root may look, but no job runs as another
        Daemon.call(d, {"type": "submit", "argv": ["true"], "cwd": "/", "gpus": 0})
    assert getattr(info.value, "code", None) == protocol.FORBIDDEN


def test_jobs_run_in_the_daemons_own_cgroup_and_the_newest_is_ranked_from_its_floor(
    make_own_daemon: Callable[..., Daemon],
) -> None:
    d = own(make_own_daemon, gpus="2x8G")
    assert d.proc is not None
    daemon_pid = d.proc.pid
    older = d.submit("sleep", "300", gpus=1)
    older_pid = d.wait_pid(older)
    assert psutil.Process(older_pid).uids().real == d.user.uid
    assert cgroup_of(older_pid) == cgroup_of(daemon_pid)  # no job cgroup: nothing delegated
    keeper_logs = " ".join(p.read_text() for p in (d.state / "keepers").glob("*/log"))
    assert "no cgroup for jobs" in keeper_logs
    d.wait_for(lambda: oom_score_adj(older_pid) == 1000, what="the only job ranked newest")

    floor = oom_score_adj(daemon_pid)
    assert floor == OOM_FLOOR, "a user's gpusvd lowered itself below its floor"
    newer = d.submit("sleep", "300", gpus=1)
    newer_pid = d.wait_pid(newer)
    d.wait_for(lambda: oom_score_adj(older_pid) == floor, what="the older job brought down")
    assert oom_score_adj(newer_pid) == 1000
    d.cli("cancel", str(newer))
    d.wait_done(newer)
    d.wait_for(lambda: oom_score_adj(older_pid) == 1000, what="the next newest promoted")
    d.cli("cancel", str(older))


def test_the_ledger_learns_a_short_peak_not_the_tail_from_the_sampler(
    make_own_daemon: Callable[..., Daemon],
) -> None:
    d = own(make_own_daemon, gpus="1x8G", config="[host_memory]\nsample_interval_s = 0.25\n")
    job = d.submit(d.python, "-c", SPIKE, gpus=0, retries=0)
    done = d.wait_done(job)
    assert done["state"] == "succeeded", d.cli("logs", "--stderr", str(job)).stdout
    peak = done["attempts"][0]["peak_rss_mb"]
    assert 290 <= peak < 400, f"recorded {peak} MiB for a 300 MiB peak and a small tail"
    dry = d.call(
        {
            "type": "submit",
            "argv": [d.python, "-c", SPIKE],
            "cwd": str(d.root),
            "gpus": 0,
            "dry_run": True,
        }
    )
    assert dry["jobs"][0]["host_memory"]["projected_mb"] >= 290


def sync_kernel_log(d: Daemon) -> None:
    """Until the daemon logs a line written after everything before it: then it has
    read those (a reset for a bus that no card has is logged, and changes nothing)."""
    marker = uuid.uuid4().hex[:8]

    def seen() -> bool:
        d.append_kernel(f"NVRM: Xid (PCI:0000:fe:00): 109, pid=1, name={marker}, Ch 00000008")
        return marker in d.log_text()

    d.wait_for(seen, what="the daemon to read the kernel log")


def test_a_kernel_oom_line_tells_an_oom_kill_from_a_plain_sigkill_without_a_counter(
    make_own_daemon: Callable[..., Daemon],
) -> None:
    d = own(make_own_daemon, gpus="1x8G", config="cpu_slots = 2\n")
    oom = d.submit("sleep", "300", gpus=0, retries=0)
    plain = d.submit("sleep", "300", gpus=0, retries=0)
    oom_pid, plain_pid = d.wait_pid(oom), d.wait_pid(plain)
    d.append_kernel(
        f"Out of memory: Killed process {oom_pid} (sleep) total-vm:1000kB, anon-rss:100kB, "
        f"file-rss:0kB, shmem-rss:0kB, UID:{d.user.uid} pgtables:40kB oom_score_adj:1000"
    )
    sync_kernel_log(d)
    os.kill(oom_pid, signal.SIGKILL)  # what the kernel's OOM killer would have done
    os.kill(plain_pid, signal.SIGKILL)  # and one that no line names
    killed = d.wait_done(oom)
    assert (killed["reason"], killed["attempts"][0]["signal"]) == ("oom_killed", 9)
    assert killed["attempts"][0]["evidence"] == {"source": "kernel_log"}
    other = d.wait_done(plain)
    assert (other["reason"], other["attempts"][0]["evidence"]) == ("signal", None)


@pytest.fixture
def delegated(
    own_user: OwnUser, make_own_daemon: Callable[..., Daemon]
) -> Iterator[tuple[Path, Callable[..., Daemon]]]:
    """A cgroup (v2) that root made and gave to the test user, as Delegate=yes does, and
    make_own_daemon, whose daemons are gone before the cgroup is removed."""
    mount = unified_mount()
    if mount is None:
        pytest.skip("no cgroup2 hierarchy")
    group = mount / f"gpusv-own-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        for path in (group, *(group / f for f in ("cgroup.procs", "cgroup.subtree_control"))):
            os.chown(path, own_user.uid, own_user.gid)
        yield group, make_own_daemon
    finally:
        remove_tree(group)  # empties each group out first, deepest first


def test_a_user_daemon_uses_a_cgroup_it_may_write_its_detection_is_by_permission(
    delegated: tuple[Path, Callable[..., Daemon]],
) -> None:
    """Not by its uid: a user's gpusvd in a cgroup delegated to it makes job cgroups there
    (the daemon's own test above, in one it may not write, makes none)."""
    group, make_own_daemon = delegated
    d = own(make_own_daemon, gpus="1x8G", start=False)
    d.cgroup = group
    d.start()
    job = d.submit("sleep", "300", gpus=0)
    pid = d.wait_pid(job)
    assert f"/{group.name}/" in cgroup_of(pid) and f"/job-{job}-1" in cgroup_of(pid)
    d.cli("cancel", str(job))
    assert d.wait_done(job)["state"] == "cancelled"
