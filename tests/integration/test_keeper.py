"""The keeper for real: processes, its socket, its journal on disk, with no daemon."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from supervisor.keeper.client import Connection, KeeperError, launch
from supervisor.keeper.journal import Journal
from supervisor.wire.framing import MAX_KEEPER_LINE

from .keeper_fixture import alive, keeper, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups and other users need root"),
]


def _exit_event(conn: Connection) -> dict:  # type: ignore[type-arg]
    while True:
        message = conn.event()
        if message.get("event") == "exit":
            return message["job"]  # type: ignore[no-any-return]


def test_spawn_records_the_exit_and_forgets_it_once_acknowledged() -> None:
    with keeper() as k:
        conn = k.connect()
        started = conn.call("spawn", **k.job(1, ["sh", "-c", "echo out; echo err >&2; exit 3"]))
        record = started["job"]
        assert record["pid"] > 0
        assert record["start_ticks"] == 0  # its cgroup names it; the tick is for those without
        v2 = k.v2
        assert v2 is not None
        assert record["cgroup"] == str(v2 / "job-1-1")
        ended = _exit_event(conn)
        assert (ended["exit_code"], ended["signal"], ended["lost"]) == (3, None, False)
        assert k.output(1) == "out\nerr\n"
        assert [j["job"] for j in conn.call("list")["jobs"]] == [1]
        with pytest.raises(KeeperError, match="exists"):  # one attempt starts once
            conn.call("spawn", **k.job(1, ["true"]))
        conn.call("ack", job=1, attempt=1)
        assert conn.call("list")["jobs"] == []
        wait_for(lambda: not (v2 / "job-1-1").exists(), "the job's cgroup to go")


@pytest.mark.parametrize("cgroups", [True, False], ids=["posix_spawn", "gated fork"])
def test_the_start_record_is_in_the_journal_before_the_command_runs(cgroups: bool) -> None:
    """Written, not necessarily synced (docs/keepers.md): the command's first act is to
    copy the journal, and the copy already holds what finds the command's process: its
    cgroup where it has one (posix_spawn), else its pid (the gated fork)."""
    with keeper(cgroups=cgroups) as k:
        conn = k.connect()
        seen = k.home / "seen"
        command = ["cp", str(k.home / "journal"), str(seen)]
        record = conn.call("spawn", **k.job(7, command))["job"]
        assert _exit_event(conn)["exit_code"] == 0, k.output(7)
        (copied,) = Journal(seen).records.values()
        assert copied.key == (7, 1)
        if cgroups:
            assert copied.cgroup is not None and copied.cgroup == record["cgroup"]
        else:
            assert copied.cgroup is None and copied.pid == record["pid"]


def test_a_command_that_cannot_start_is_refused_with_the_reason() -> None:
    with keeper() as k:
        conn = k.connect()
        with pytest.raises(KeeperError, match="executable not found: no-such-cmd"):
            conn.call("spawn", **k.job(1, ["no-such-cmd"]))
        with pytest.raises(KeeperError, match="cannot enter working directory /nonexistent"):
            conn.call("spawn", **k.job(2, ["true"], cwd="/nonexistent"))
        assert "cannot enter working directory" in k.output(2)
        records = {j["job"]: j for j in conn.call("list")["jobs"]}
        assert records[1]["error"] == "executable not found: no-such-cmd"
        assert records[1]["exit_code"] == 127


def test_an_exit_while_no_client_is_connected_is_kept_with_its_true_status() -> None:
    with keeper() as k:
        conn = k.connect()
        for job in (1, 2):
            os.mkfifo(k.home / f"fifo{job}")
            script = f"read x < {k.home}/fifo{job}; [ $x = kill ] && kill -9 $$; exit 3"
            conn.call("spawn", **k.job(job, ["sh", "-c", script]))
        conn.close()
        for job, word in ((1, "exit"), (2, "kill")):
            (k.home / f"fifo{job}").write_text(word + "\n")
        journal = k.home / "journal"
        wait_for(lambda: journal.read_text().count('"e":"exit"') == 2, "both exits on disk")
        records = {j["job"]: j for j in k.connect().call("list")["jobs"]}
        assert (records[1]["exit_code"], records[1]["signal"]) == (3, None)
        assert (records[2]["exit_code"], records[2]["signal"]) == (None, signal.SIGKILL)


def test_the_keeper_outlives_its_client_and_fences_an_older_one() -> None:
    with keeper() as k:
        client = (
            "import sys, os, signal; from pathlib import Path\n"
            "from supervisor.keeper.client import Connection\n"
            f"c = Connection(Path('{k.home}/sock')); c.call('attach')\n"
            f"c.call('spawn', **{k.job(1, ['sleep', '1000'])!r})\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        done = subprocess.run([sys.executable, "-c", client], check=False)
        assert done.returncode == -signal.SIGKILL
        first = k.connect()
        (record,) = first.call("list")["jobs"]
        assert alive(record["pid"]) and record["ended_at"] is None
        second = k.connect()  # a new daemon attaches: the older connection is closed
        with pytest.raises((ConnectionError, OSError)):
            first.call("ping")
        second.call("kill", job=1, attempt=1, grace_s=5)
        assert not alive(record["pid"])


def test_malformed_requests_are_answered_and_cost_nothing() -> None:
    with keeper() as k:
        conn = k.connect()
        pid = conn.call("spawn", **k.job(1, ["sleep", "1000"]))["job"]["pid"]
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(str(k.home / "sock"))
        reader = raw.makefile("rb")
        for line in (
            b"garbage",
            b"[1, 2]",
            b'{"op": "fly"}',
            b'{"op": "spawn", "job": 2}',
            b'{"op": "kill", "job": "x"}',
            b'{"id": 5, "op": "ack"}',
        ):
            raw.sendall(line + b"\n")
            answer = json.loads(reader.readline())
            assert answer["ok"] is False and answer["error"]["code"] == "bad_request", line
        bad = k.job(3, ["true"], cwd="relative")
        with pytest.raises(KeeperError, match="cwd: an absolute path"):
            conn.call("spawn", **bad)
        # Over the line limit: answered by its id, skipped to its end, the connection kept.
        raw.sendall(b'{"id":7,"op":"ping","pad":"' + b"x" * MAX_KEEPER_LINE)
        answer = json.loads(reader.readline())
        assert (answer["id"], answer["error"]["code"]) == (7, "too_large")
        raw.sendall(b'xx"}\n{"id":8,"op":"ping"}\n')  # the rest of it, then a request
        assert json.loads(reader.readline())["id"] == 8
        assert alive(pid) and [j["job"] for j in conn.call("list")["jobs"]] == [1]
        assert "bad request" in (k.home / "log").read_text()


def test_another_user_is_refused_by_peer_credentials() -> None:
    with keeper() as k:
        os.chmod(k.home.parent, 0o755)  # let the other user reach the socket: the check
        os.chmod(k.home, 0o755)  # that refuses them is then the keeper's own
        os.chmod(k.home / "sock", 0o666)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the other user
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(k.home / "sock"))  # answered at once, before any request
                os.write(write, s.makefile("rb").readline())
                code = 0
            except BaseException as exc:
                os.write(write, repr(exc).encode())
            finally:
                os._exit(code)
        os.close(write)
        answer = os.read(read, 4096)
        os.waitpid(child, 0)
        assert json.loads(answer)["error"]["code"] == "forbidden"
        assert "refused a connection from uid 65534" in (k.home / "log").read_text()


def test_a_second_keeper_for_the_same_directory_leaves_the_first_serving() -> None:
    with keeper() as k:
        pid = k.pid
        launch(k.home, k.v2, k.memcg)  # exit 3 (held) is not an error
        assert k.pid == pid


def test_jobs_of_a_keeper_that_died_are_killed_and_recorded_lost() -> None:
    with keeper() as k:
        conn = k.connect()
        script = "sleep 1000 & setsid sleep 1000 & wait"
        record = conn.call("spawn", **k.job(1, ["sh", "-c", script]))["job"]
        pids = wait_for(
            lambda: len(p := conn.call("procs", job=1, attempt=1)["pids"]) == 3 and p,
            "the job's three processes",
        )
        os.kill(k.pid, signal.SIGKILL)
        k.start()  # a new keeper on the same journal
        (lost,) = k.connect().call("list")["jobs"]
        assert lost["lost"] is True and lost["ended_at"] is not None
        assert lost["pid"] == record["pid"]
        assert not any(alive(pid) for pid in pids)


def test_output_that_cannot_be_written_is_dropped_and_counted_and_the_job_runs_on() -> None:
    """The job writes into a pipe that the keeper relays: a file that cannot be opened
    costs the output, never the job, and the bytes dropped come with its exit."""
    with keeper() as k:
        conn = k.connect()
        argv = ["sh", "-c", "echo out; echo err >&2; exit 0"]
        bad = k.job(1, argv, stdout="/nonexistent/out", stderr="/nonexistent/err")
        conn.call("spawn", **bad)
        ended = _exit_event(conn)
        assert ended["exit_code"] == 0
        assert ended["output_dropped"] == len("out\n") + len("err\n")
