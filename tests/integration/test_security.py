"""Hostile input and several Unix users against a real gpusvd.

The multi-user tests create real users (useradd) and run the CLI, jobs and a daemon as
them; they need root and skip elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.client.cli import Refused
from supervisor.client.render import LIST_HEADER
from supervisor.daemon.requests.connections import EVICT_IDLE_S
from supervisor.daemon.views import PUBLIC_FIELDS
from supervisor.wire import protocol

from .conftest import Daemon
from .unprivileged import copy_code

CODES = {
    protocol.BAD_JSON,
    protocol.BAD_REQUEST,
    protocol.UNKNOWN_TYPE,
    protocol.TOO_LARGE,
    protocol.NOT_FOUND,
}
MIB = 1024 * 1024


class Raw:
    """A raw connection to the daemon's socket: lines out, answers back."""

    def __init__(self, path: Path, timeout: float = 20.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""

    def send(self, line: bytes) -> dict[str, Any]:
        self.sock.sendall(line + b"\n")
        return self.read()

    def read(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"closed by gpusvd; had {self.buf[:200]!r}")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def closed_by_daemon(self) -> bool:
        try:
            return self.sock.recv(65536) == b""
        except ConnectionResetError:  # closed with our unread bytes still queued
            return True

    def close(self) -> None:
        self.sock.close()


def error_code(reply: dict[str, Any]) -> str:
    assert reply["ok"] is False, reply
    assert reply["error"]["message"], reply
    return str(reply["error"]["code"])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def send_huge_line(path: Path, size: int) -> tuple[dict[str, Any], int]:
    """Write `size` bytes without a newline from a thread; read the answer meanwhile.
    Returns the answer and how many bytes the daemon let us write before it closed."""
    conn = Raw(path)
    sent = 0

    def pump() -> None:
        nonlocal sent
        chunk = b"x" * MIB
        with contextlib.suppress(OSError):
            while sent < size:
                sent += conn.sock.send(chunk)

    writer = threading.Thread(target=pump, daemon=True)
    writer.start()
    try:
        reply = conn.read()
        assert conn.closed_by_daemon()
        writer.join(20)
        assert not writer.is_alive(), "the daemon kept reading the oversized line"
    finally:
        conn.close()
    return reply, sent


MALFORMED: list[tuple[bytes, str]] = [
    (b"", protocol.BAD_JSON),
    (b"garbage", protocol.BAD_JSON),
    (b"\xc3\x28\xff", protocol.BAD_JSON),
    (b'{"type":"\\ud800"}', protocol.BAD_JSON),
    (b"[" * 100_000 + b"]" * 100_000, protocol.BAD_JSON),
    (b'{"type":"ping","n":1e999999}', protocol.BAD_REQUEST),
    (b"[1,2]", protocol.BAD_REQUEST),
    (b'{"type":null}', protocol.BAD_REQUEST),
    (b'{"type":"shutdown"}', protocol.UNKNOWN_TYPE),
    (b'{"type":"submit","cwd":"/tmp"}', protocol.BAD_REQUEST),
    (b'{"type":"submit","argv":["true"],"cwd":"/tmp","owner_uid":0}', protocol.BAD_REQUEST),
    (b'{"type":"submit","argv":["true"],"cwd":"/tmp","gpus":1.0}', protocol.BAD_REQUEST),
    (b'{"type":"submit","argv":["true"],"cwd":"/tmp","gpus":9}', protocol.BAD_REQUEST),
    (b'{"type":"submit","argv":["true"],"cwd":"/tmp","env":{"A=B":"x"}}', protocol.BAD_REQUEST),
    (b'{"type":"submit","argv":["true"],"cwd":"/tmp","mem_scale":0}', protocol.BAD_REQUEST),
    (b'{"type":"submit","argv":["\\udcff"],"cwd":"/tmp"}', protocol.BAD_JSON),
    (b'{"type":"submit","argv":["true"],"cwd":"/tmp","after":[99]}', protocol.NOT_FOUND),
    (b'{"type":"submit_batch","argvs":[["true"],["true"],[]],"cwd":"/tmp"}', protocol.BAD_REQUEST),
    (b'{"type":"show","ids":[9223372036854775808]}', protocol.BAD_REQUEST),
    (b'{"type":"show","ids":[42]}', protocol.NOT_FOUND),
]


def test_hostile_input_gets_typed_errors_creates_nothing_and_the_daemon_serves_on(
    daemon: Daemon,
) -> None:
    pid = daemon.proc.pid if daemon.proc else 0
    idle = [Raw(daemon.socket) for _ in range(50)]
    conn = Raw(daemon.socket)
    for line, code in MALFORMED:
        assert error_code(conn.send(line)) == code, line[:80]
    assert conn.send(b'{"type":"cancel","ids":[42]}')["results"][0]["ok"] is False  # per id
    ping = b'{"type":"ping"}'
    conn.sock.sendall(ping + b" " * (protocol.MAX_LINE - len(ping)))  # at the limit...
    time.sleep(0.2)  # ...all of it read before the newline comes
    assert conn.send(b"")["ok"]
    rng = random.Random(1234)
    for _ in range(300):
        junk = rng.randbytes(rng.randrange(1, 300)).replace(b"\n", b"")
        assert error_code(conn.send(junk)) in CODES
    half = Raw(daemon.socket)
    half.sock.sendall(b'{"type":"submit","argv":["true"],"cwd":"/tmp"')  # then hangs up
    half.close()

    before = peak_rss_mb(pid)
    reply, sent = send_huge_line(daemon.socket, 64 * MIB)
    assert error_code(reply) == protocol.TOO_LARGE
    assert sent < 16 * MIB, f"the daemon read {sent} bytes of a 64 MiB line"
    assert peak_rss_mb(pid) - before < 32, "the daemon's memory grew with the line"

    job = daemon.submit("true", gpus=0)  # a new connection while 50 others sit idle
    assert daemon.wait_done(job)["state"] == "succeeded"
    assert all(c.send(b'{"type":"ping"}')["ok"] for c in (idle[0], idle[-1], conn))
    for c in (*idle, conn):
        c.close()
    assert [j["id"] for j in daemon.call({"type": "list"})["jobs"]] == [job]
    assert daemon.proc is not None and daemon.proc.poll() is None


LIMITS = """
cpu_slots = 4
max_queued_per_user = 2
[limits]
max_connections = 3
idle_timeout_s = 1
"""


def connect_served(path: Path) -> Raw:
    """A connection that the daemon took (its own periodic self-check may hold a slot)."""
    for _ in range(50):
        conn = Raw(path)
        with contextlib.suppress(OSError, EOFError):  # answered busy and closed
            if conn.send(b'{"type":"ping"}')["ok"]:
                return conn
        conn.close()
        time.sleep(0.1)
    raise AssertionError("never got a connection slot")


def test_idle_clients_are_dropped_and_connection_and_queue_caps_hold(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config=LIMITS)
    # The start's own check (a ping) may still be held on gpusvd's side, and with its
    # check-in and `silent` that fills the cap of 3: once idle that long it makes room.
    time.sleep(EVICT_IDLE_S)
    silent, trickle = Raw(d.socket), Raw(d.socket)
    trickle.sock.sendall(b'{"type":')  # a line that never ends is idle too
    assert silent.closed_by_daemon() and trickle.closed_by_daemon()

    first = d.submit("sleep", "30", gpus=0)
    d.submit("sleep", "30", gpus=0)
    with pytest.raises(Refused) as info:
        d.submit("true", gpus=0)
    assert info.value.code == protocol.LIMIT
    cli = d.cli("submit", "--gpus", "0", "--", "true", check=False)
    assert cli.returncode == 1 and "limit" in cli.stderr

    held = []
    for _ in range(3):  # each busy in a request at once, so never idle
        held.append(conn := connect_served(d.socket))
        conn.sock.sendall(b'{"type":"wait","ids":[%d],"timeout_s":3}\n' % first)
    extra = Raw(d.socket)
    assert error_code(extra.read()) == protocol.BUSY
    assert extra.closed_by_daemon()
    for conn in held:
        assert conn.read()["timed_out"] is True
        conn.close()
    d.cli("cancel", str(first))
    d.wait_done(first)
    assert d.submit("true", gpus=0)  # a slot in the queue again
    assert len(d.call({"type": "list"})["jobs"]) == 3


def test_a_full_descriptor_table_is_waited_out(make_daemon: Callable[..., Daemon]) -> None:
    d = make_daemon(config="[limits]\nidle_timeout_s = 5\n")
    proc = psutil.Process(d.proc.pid if d.proc else 0)
    soft, hard = proc.rlimit(psutil.RLIMIT_NOFILE)
    proc.rlimit(psutil.RLIMIT_NOFILE, (proc.num_fds() + 2, hard))
    conns = []
    try:
        conns = [Raw(d.socket) for _ in range(8)]
        d.wait_for(lambda: "cannot accept a connection now" in d.log_text(), what="EMFILE")
    finally:
        proc.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
    for conn in conns:
        conn.close()
    assert d.call({"type": "ping"})["ok"]
    assert d.proc is not None and d.proc.poll() is None


def test_a_socket_group_that_does_not_exist_stops_the_start(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(config='socket_group = "gpusv-no-such-group"\n', start=False)
    result = subprocess.run(d.argv(), capture_output=True, text=True, timeout=30, env=d.env)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after any start-up warnings
    assert last.startswith("gpusvd: socket_group") and "gpusv-no-such-group" in last
    assert not d.socket.exists()


def test_a_second_daemon_on_the_socket_leaves_the_first_ones_jobs_alone(daemon: Daemon) -> None:
    job = daemon.submit("sleep", "30", gpus=0)
    pid = daemon.wait_pid(job)
    result = subprocess.run(daemon.argv(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "already serving" in result.stderr
    assert psutil.pid_exists(pid) and daemon.show(job)["state"] == "running"
    assert daemon.show(job)["attempts"][0]["reason"] is None


# ---- several Unix users ---------------------------------------------------------------


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass
class Users:
    """A group, two members and one outsider, and a copy of gpusv that they can run."""

    group: str
    gid: int
    member: User
    other_member: User
    outsider: User
    shared: Path  # 0755: sockets, the copied code, a user daemon's directory
    python: str

    def env(self, user: User) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(user.home),
            "USER": user.name,
            "LOGNAME": user.name,
            "PYTHONPATH": str(self.shared / "code"),
            "GPUSV_TEST_ROOT": str(self.shared),
        }

    def argv(self, user: User, *argv: str) -> list[str]:
        """`argv` as `user`, with their groups: setpriv execs, so a pid is theirs."""
        ids = [f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
        return ["setpriv", *ids, "--", *argv]

    def run(
        self, user: User, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(user, *argv),
            capture_output=True,
            text=True,
            timeout=60,
            env={**self.env(user), **(env or {})},
            cwd=user.home,
        )

    def cli(
        self, user: User, sock: Path, *args: str, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            user, self.python, "-m", "supervisor.client.cli", "--socket", str(sock), *args, **kw
        )

    def call(self, user: User, sock: Path, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        """Raw requests as `user`; each answer as the daemon gave it (ok or not)."""
        return self.call_as(self.argv(user), self.env(user), sock, *requests)

    def call_as(
        self, prefix: list[str], env: dict[str, str], sock: Path, *requests: dict[str, Any]
    ) -> list[dict[str, Any]]:
        script = (
            "import json, sys; from supervisor.client.cli import Client, Refused\n"
            "c = Client(sys.argv[1]); out = []\n"
            "for r in json.loads(sys.argv[2]):\n"
            "    try: out.append(c.call(r))\n"
            "    except Refused as e: out.append({'ok': False, 'code': e.code, 'msg': str(e)})\n"
            "print(json.dumps(out))\n"
        )
        done = subprocess.run(
            [*prefix, self.python, "-c", script, str(sock), json.dumps(list(requests))],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=self.shared,
        )
        assert done.returncode == 0, done.stderr
        replies: list[dict[str, Any]] = json.loads(done.stdout)
        return replies


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _python_for(users: Users) -> str | None:
    """An interpreter (3.11+) that an ordinary user may run, with the copied code."""
    for candidate in (
        os.path.realpath(sys.executable),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ):
        probe = "import sys, supervisor.daemon.life.app; sys.exit(sys.version_info < (3, 11))"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if users.run(users.member, candidate, "-c", probe).returncode == 0:
                return candidate
    return None


def _add_user(name: str, groups: str) -> User:
    _sh("useradd", "--create-home", "--shell", "/bin/sh", *(["-G", groups] if groups else []), name)
    import pwd

    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    if os.geteuid() != 0:
        pytest.skip("creating Unix users needs root")
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    tag = uuid.uuid4().hex[:6]
    group = f"gpusvtest-{tag}"
    shared = Path(tempfile.mkdtemp(prefix=f"gpusv-sec-{tag}-"))
    made: list[str] = []
    try:
        _sh("groupadd", group)
        import grp

        members = []
        for suffix, groups in (("a", group), ("b", group), ("x", "")):
            members.append(_add_user(f"{group}{suffix}", groups))
            made.append(members[-1].name)
        shared.chmod(0o755)
        copy_code(shared / "code")
        member, other_member, outsider = members
        result = Users(
            group, grp.getgrnam(group).gr_gid, member, other_member, outsider, shared, ""
        )
        python = _python_for(result)
        if python is None:
            pytest.skip("no Python 3.11+ that an ordinary user may run")
        result.python = python
        yield result
    finally:
        for name in made:
            _kill_user_processes(name)
            subprocess.run(["userdel", "-r", name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", group], capture_output=True, timeout=60)
        shutil.rmtree(shared, ignore_errors=True)


def _kill_user_processes(name: str) -> None:
    for proc in psutil.process_iter(["username"]):
        if proc.info["username"] == name:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def group_daemon(make_daemon: Callable[..., Daemon], users: Users) -> Daemon:
    d = make_daemon(config=f'socket_group = "{users.group}"\ncpu_slots = 8\n', start=False)
    d.socket = users.shared / f"{uuid.uuid4().hex[:8]}.sock"  # a path the users can reach
    return d.start()


ID_SCRIPT = 'id -u; id -g; id -G; echo "$HOME $USER"; pwd; id -u > id.out'


def test_jobs_run_as_their_submitter_and_others_see_only_public_fields(
    make_daemon: Callable[..., Daemon], users: Users
) -> None:
    d = group_daemon(make_daemon, users)
    a = users.member
    st = d.socket.stat()
    assert st.st_mode & 0o777 == 0o660 and st.st_gid == users.gid
    assert d.state.stat().st_mode & 0o777 == 0o700
    for db in d.state.glob("state.db*"):
        assert db.stat().st_mode & 0o777 == 0o600, db

    lies = {"HOME": "/root", "USER": "root"}  # the job's identity comes from passwd
    done = users.cli(
        a, d.socket, "submit", "--gpus", "0", "--wait", "--", "sh", "-c", ID_SCRIPT, env=lies
    )
    assert done.returncode == 0, done.stderr
    mine = int(done.stdout.split()[0])
    out = users.cli(a, d.socket, "logs", str(mine))
    uid, gid, groups, env, cwd = out.stdout.splitlines()
    assert (int(uid), int(gid)) == (a.uid, a.gid)
    assert {int(g) for g in groups.split()} == {a.gid, users.gid}
    assert (env, cwd) == (f"{a.home} {a.name}", str(a.home))
    assert (a.home / "id.out").stat().st_uid == a.uid
    log = d.state / "logs" / f"{mine}.out"
    assert (log.stat().st_uid, log.stat().st_mode & 0o777) == (a.uid, 0o600)

    secret = "s3cret-" + uuid.uuid4().hex
    roots = d.submit("sleep", "30", gpus=0, name=secret, env={"TOKEN": secret})
    d.wait_state(roots, "running")
    pending = users.cli(a, d.socket, "submit", "--gpus", "0", "--", "sleep", "30")
    own = int(pending.stdout)
    listed = users.cli(a, d.socket, "list", "--json")
    theirs = next(j for j in json.loads(listed.stdout) if j["id"] == roots)
    assert set(theirs) == set(PUBLIC_FIELDS) and secret not in listed.stdout
    rows = users.cli(a, d.socket, "list").stdout.splitlines()
    their_row = next(r.split() for r in rows if r.split()[0] == str(roots))
    age = their_row[LIST_HEADER.index("AGE")]
    assert re.fullmatch(r"\d+[smhd]", age) and "(not yours)" in " ".join(their_row)
    top, waited = users.call(
        a, d.socket, {"type": "top"}, {"type": "wait", "ids": [roots], "timeout_s": 0.1}
    )
    assert secret not in json.dumps(top) and any(r["id"] == roots for r in top["running"])
    assert waited["ok"] and secret not in json.dumps(waited)
    for args in (["show", str(roots)], ["logs", str(roots)], ["cancel", str(own), str(roots)]):
        refused = users.cli(a, d.socket, *args)
        assert refused.returncode == 1 and "forbidden" in refused.stderr, (args, refused.stderr)
    assert d.show(roots)["state"] == "running"
    assert d.show(own)["state"] == "running"  # a refused request changes nothing

    hung = d.submit("sleep", "30", labels={"frame": secret}, gpu_hang_retries=0)
    card = d.wait_state(hung, "running")["gpus"][0]
    d.append_kernel(f"NVRM: Xid (PCI:0000:0{card + 1}:00): 109, pid=1, name=x, Ch 00000008")
    d.wait_for(lambda: d.call({"type": "stats"})["gpu_hangs"], what="the hang record")
    assert d.call({"type": "stats"})["gpu_hangs"][0]["labels"] == {"frame": secret}
    (stats,) = users.call(a, d.socket, {"type": "stats"})
    assert stats["gpu_hangs"][0]["job"] == hung and secret not in json.dumps(stats)

    stranger = users.cli(users.outsider, d.socket, "list")
    assert stranger.returncode == 3 and "permission denied" in stranger.stderr
    assert users.cli(a, d.socket, "cancel", str(own)).returncode == 0


def test_a_job_never_runs_in_a_directory_its_user_cannot_enter(
    make_daemon: Callable[..., Daemon], users: Users
) -> None:
    d = group_daemon(make_daemon, users)
    a = users.member
    marker = users.shared / f"ran-{uuid.uuid4().hex[:6]}"
    argv = ["sh", "-c", f"touch {marker}"]
    locked = Path(tempfile.mkdtemp(dir=users.shared))  # root's, 0700
    submitted = users.call(
        a,
        d.socket,
        *(
            {"type": "submit", "argv": argv, "cwd": cwd, "gpus": 0, "env": {}}
            for cwd in (str(locked), str(locked / "missing"), "/nonexistent-gpusv")
        ),
    )
    messages = []
    for reply, cwd in zip(
        submitted, (locked, locked / "missing", "/nonexistent-gpusv"), strict=True
    ):
        job = d.wait_done(reply["ids"][0])
        assert (job["state"], job["reason"]) == ("failed", "spawn_failed"), job
        (attempt,) = d.show(job["id"])["attempts"]
        assert attempt["reason"] == "spawn_failed" and attempt["pid"] is None
        messages.append(attempt["evidence"]["message"].replace(str(cwd), "DIR"))
    assert not marker.exists()
    assert f"as uid {a.uid}" in messages[0]
    assert len(set(messages)) == 1, messages  # no telling "missing" from "not yours"
    err = users.cli(a, d.socket, "logs", "--stderr", str(submitted[0]["ids"][0]))
    assert f"cannot enter working directory {locked}" in err.stdout
    assert "Permission denied" in err.stdout


def test_a_uid_without_a_passwd_entry_never_runs_as_anyone_else(
    make_daemon: Callable[..., Daemon], users: Users
) -> None:
    d = group_daemon(make_daemon, users)
    nobody = 2_000_000_000 + os.getpid() % 1000  # no passwd entry, but in socket_group
    prefix = ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", f"--groups={users.gid}", "--"]
    marker = users.shared / f"ran-{uuid.uuid4().hex[:6]}"
    request = {"type": "submit", "argv": ["touch", str(marker)], "cwd": "/", "gpus": 0}
    (reply,) = users.call_as(prefix, users.env(users.member), d.socket, request)
    job = d.wait_done(reply["ids"][0])
    assert (job["owner_uid"], job["reason"]) == (nobody, "spawn_failed")
    message = d.show(job["id"])["attempts"][0]["evidence"]["message"]
    assert f"uid {nobody} has no passwd entry" in message
    assert not marker.exists() and d.call({"type": "ping"})["ok"]


class UserDaemon(Daemon):
    """A gpusvd started by an ordinary user (no root anywhere in it)."""

    def __init__(self, root: Path, users: Users, user: User, config: str) -> None:
        super().__init__(root, "1x8G", config, {})
        self.users, self.user = users, user
        self.env = {**users.env(user), "PYTHONUNBUFFERED": "1"}

    def argv(self) -> list[str]:
        return self.users.argv(self.user, self.users.python, *super().argv()[1:])


def test_a_non_root_daemon_serves_only_its_own_user(users: Users) -> None:
    a, b = users.member, users.other_member
    root = users.shared / f"daemon-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    os.chown(root, a.uid, a.gid)
    d = UserDaemon(root, users, a, f'socket_group = "{users.group}"\n')
    try:
        d.start()
        assert d.socket.stat().st_uid == a.uid and d.socket.stat().st_gid == users.gid
        done = users.cli(a, d.socket, "submit", "--gpus", "0", "--wait", "--", "sh", "-c", "id -u")
        assert done.returncode == 0, done.stderr
        out = users.cli(a, d.socket, "logs", done.stdout.split()[0]).stdout
        assert out.strip() == str(a.uid)
        other = users.cli(b, d.socket, "submit", "--gpus", "0", "--", "true")
        assert other.returncode == 1 and "forbidden" in other.stderr
        assert f"uid {a.uid}" in other.stderr
        assert users.cli(b, d.socket, "list").returncode == 1
        with pytest.raises(Refused) as info:  # root may look, but not run jobs as a
            d.submit("true", gpus=0)
        assert info.value.code == protocol.FORBIDDEN
        assert len(d.call({"type": "list"})["jobs"]) == 1
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def test_admin_group_members_may_watch_and_cancel_every_job_and_others_may_not(
    make_daemon: Callable[..., Daemon], users: Users
) -> None:
    # The admin group is b's own group (useradd made one per user): b is a member, a is
    # not, and both reach the socket through the shared group.
    a, b = users.member, users.other_member
    config = f'socket_group = "{users.group}"\nadmin_group = "{b.name}"\ncpu_slots = 8\n'
    d = make_daemon(config=config, start=False)
    d.socket = users.shared / f"{uuid.uuid4().hex[:8]}.sock"
    d.start()
    secret = "s3cret-" + uuid.uuid4().hex
    submitted = users.cli(
        a, d.socket, "submit", "--gpus", "0", "--name", secret, "--", "sleep", "30"
    )
    mine = int(submitted.stdout)
    theirs = int(users.cli(b, d.socket, "submit", "--gpus", "0", "--", "sleep", "30").stdout)
    d.wait_state(mine, "running")
    d.wait_state(theirs, "running")

    seen = users.cli(b, d.socket, "show", "--json", str(mine))
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout)["name"] == secret
    listed = json.loads(users.cli(b, d.socket, "list", "--json").stdout)
    assert next(j for j in listed if j["id"] == mine)["name"] == secret

    for args in (["show", str(theirs)], ["logs", str(theirs)], ["cancel", str(theirs)]):
        refused = users.cli(a, d.socket, *args)
        assert refused.returncode == 1 and "forbidden" in refused.stderr, (args, refused.stderr)
    assert d.show(theirs)["state"] == "running"

    cancelled = users.cli(b, d.socket, "cancel", str(mine))
    assert cancelled.returncode == 0, cancelled.stderr
    assert d.wait_done(mine)["state"] == "cancelled"
    d.cli("cancel", str(theirs))
