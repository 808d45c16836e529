"""Faults inside the keeper, through its own seams: a fork or a posix_spawn that fails
for a passing cause, a pidfd that cannot be opened, a handler that raises. Each request
is answered, a passing failure says so, and a job that started is never let go."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.keeper import cgroup, direct, spawn
from supervisor.keeper.jobs import Jobs, Refused
from supervisor.keeper.journal import Journal, Record
from supervisor.keeper.server import Conn, Server
from supervisor.keeper.takeover import _kill_orphan

UNIFIED = Path("/sys/fs/cgroup/unified")


def _spec(tmp: Path, job: int, argv: list[str]) -> spawn.Spec:
    out = str(tmp / f"{job}.out")
    env = {"PATH": "/usr/bin:/bin"}
    return spawn.Spec(job, 1, tuple(argv), "/tmp", env, out, out)


NO_ROOTS = cgroup.Roots()


def _jobs(tmp: Path, roots: cgroup.Roots = NO_ROOTS) -> tuple[Jobs, list[str]]:
    said: list[str] = []
    return Jobs(Journal(tmp / "journal", log=said.append), roots, said.append), said


def _eagain(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.EAGAIN, "Resource temporarily unavailable")


def test_a_fork_that_fails_eagain_is_refused_as_passing_with_nothing_recorded(
    tmp_path: Path,
) -> None:
    jobs, _ = _jobs(tmp_path)
    jobs.fork = _eagain
    with pytest.raises(Refused) as refused:
        jobs.spawn(_spec(tmp_path, 1, ["true"]), lambda answer: None)
    assert refused.value.error() == {
        "code": "spawn",
        "message": "cannot start the job: Resource temporarily unavailable",
        "transient": True,
    }
    assert jobs.journal.records == {} and jobs.live == {}


def test_only_a_cause_that_may_pass_is_transient() -> None:
    for code in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC):
        assert spawn.transient(OSError(code, os.strerror(code)))
    for code in (errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.E2BIG):
        assert not spawn.transient(OSError(code, os.strerror(code)))


def _reap_until_ended(jobs: Jobs, key: tuple[int, int]) -> Record:
    deadline = time.monotonic() + 30
    while not jobs.journal.records[key].ended:
        assert time.monotonic() < deadline, "the job's exit was never recorded"
        jobs.reap_all()
        time.sleep(0.01)
    return jobs.journal.records[key]


def test_a_job_whose_pidfd_cannot_be_opened_is_still_kept_and_its_exit_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs, said = _jobs(tmp_path)
    real_open = os.pidfd_open
    monkeypatch.setattr(os, "pidfd_open", lambda pid, flags=0: _eagain())
    answers: list[dict[str, Any]] = []
    live = jobs.spawn(_spec(tmp_path, 1, ["sh", "-c", "exit 4"]), answers.append)
    monkeypatch.setattr(os, "pidfd_open", real_open)
    assert live is not None and live.pidfd is None and (1, 1) in jobs.live
    assert any("no pidfd" in line for line in said)
    record = _reap_until_ended(jobs, (1, 1))
    assert record.exit_code == 4 and (1, 1) not in jobs.live


def test_a_start_record_with_pid_0_is_never_signalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A posix_spawn start is written with pid 0 before its process exists: whatever is
    left of it, no path may turn that into kill(0) or killpg(0), the keeper's own group."""
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid)))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(("killpg", pid)))
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig: sent.append(("fd", fd)))
    jobs, _ = _jobs(tmp_path)
    record = Record(1, 1, 0, 0, time.time())
    jobs.journal.append("start", record)
    jobs.send(record, signal.SIGKILL)
    _kill_orphan(record)
    assert jobs.procs((1, 1)) == []
    assert sent == []


@pytest.fixture
def restored_signals() -> Iterator[None]:
    """Server() sets the keeper's own handlers: this process gets its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGHUP, signal.SIGINT)}
    saved[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _server(tmp: Path, jobs: Jobs) -> tuple[Server, Conn, socket.socket]:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp / "sock"))
    listener.listen()
    server = Server(jobs, listener, lambda message: None)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = Conn(ours)
    server.conns.add(conn)
    return server, conn, theirs


def _answer(theirs: socket.socket) -> dict[str, Any]:
    theirs.settimeout(10)
    return dict(json.loads(theirs.makefile("rb").readline()))


def test_a_request_whose_handler_raises_anything_is_answered_and_the_connection_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_signals: None
) -> None:
    jobs, _ = _jobs(tmp_path)
    server, conn, theirs = _server(tmp_path, jobs)

    def broken(spec: spawn.Spec, reply: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(jobs, "spawn", broken)
    spec = {"job": 1, "attempt": 1, "argv": ["true"], "cwd": "/", "env": {}}
    line = {"id": 9, "op": "spawn", **spec, "stdout": "/tmp/x", "stderr": "/tmp/x"}
    server._request(conn, json.dumps(line).encode())
    answer = _answer(theirs)
    assert answer["id"] == 9 and answer["ok"] is False
    assert answer["error"]["code"] == "internal" and "Input/output" in answer["error"]["message"]
    assert not conn.closed and conn in server.conns


def test_the_keeper_ignores_hangups_and_interrupts_and_serves_on_after_sigterm(
    tmp_path: Path, restored_signals: None
) -> None:
    jobs, _ = _jobs(tmp_path)
    server, _, _ = _server(tmp_path, jobs)
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGTERM)  # handled: counted, said from the loop
    assert server.terms == 1 and not server.stopping


@pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(), reason="needs cgroup2")
def test_a_posix_spawn_that_fails_eagain_ends_its_record_and_answers_passing(
    tmp_path: Path,
) -> None:
    root = UNIFIED / f"gpusv-test-{uuid.uuid4().hex[:10]}"
    root.mkdir()
    try:
        roots = cgroup.Roots(str(root), None)
        home, why = direct.Home.probe(roots)
        if home is None:
            pytest.skip(f"this host cannot start jobs with posix_spawn: {why}")
        jobs, _ = _jobs(tmp_path, roots)
        jobs.direct = home
        home.posix_spawn = _eagain
        answers: list[dict[str, Any]] = []
        assert jobs.spawn(_spec(tmp_path, 1, ["true"]), answers.append) is None
        jobs.journal.sync()
        for action in jobs.after_sync:
            action()
        (answer,) = answers
        assert answer["error"]["code"] == "spawn" and answer["error"]["transient"] is True
        assert jobs.journal.records[(1, 1)].exit_code == 127  # its record ended: no process
    finally:
        cgroup.remove_tree(root)


def test_a_request_without_an_id_is_answered_only_when_it_fails(
    tmp_path: Path, restored_signals: None
) -> None:
    """gpusvd sends its acks without an id: nobody waits for their answer."""
    jobs, _ = _jobs(tmp_path)
    server, conn, theirs = _server(tmp_path, jobs)
    server._request(conn, b'{"op": "ping"}')  # succeeds: no answer
    server._request(conn, b'{"op": "ack", "job": 5, "attempt": 1}')  # fails: answered
    server._request(conn, b'{"id": 3, "op": "ping"}')
    theirs.settimeout(10)
    reader = theirs.makefile("rb")
    failed, pong = json.loads(reader.readline()), json.loads(reader.readline())
    assert failed["id"] is None and failed["error"]["code"] == "unknown"
    assert pong["id"] == 3 and pong["ok"] is True
