"""gpusvd's keeper client against real keepers: spawn, wait, kill, and taking jobs back
from a keeper after the client that started them went away."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor.daemon.running.handles import exit_status
from supervisor.daemon.running.keepers import KeeperGone, Keepers
from supervisor.daemon.running.launch import SpawnError
from supervisor.keeper import cgroup
from supervisor.keeper.client import pid_of
from supervisor.keeper.spawn import Spec

from .keeper_fixture import MEMCG, UNIFIED, alive, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root("job cgroups need root"),
]


@contextlib.contextmanager
def state_dir() -> Iterator[tuple[Path, Path, Path]]:
    """A short state dir (socket paths) and cgroup roots; every keeper in it is killed and
    every cgroup removed afterwards."""
    state = Path(tempfile.mkdtemp(prefix="ks-", dir="/tmp"))
    tag = f"gpusv-test-{uuid.uuid4().hex[:10]}"
    v2, v1 = UNIFIED / tag, MEMCG / tag
    try:
        yield state, v2, v1
    finally:
        for home in (state / "keepers").glob("*"):
            pid = pid_of(home)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)

                def dead(pid: int = pid) -> bool:
                    return not alive(pid)

                wait_for(dead, "a keeper to die")
        for root in (v2, v1):
            for group in sorted(root.glob("**/job-*"), reverse=True) if root.exists() else []:
                cgroup.empty_out(group)
                group.rmdir()
            for sub in sorted(root.glob("*"), reverse=True) if root.exists() else []:
                if sub.is_dir():
                    sub.rmdir()
            if root.exists():
                root.rmdir()
        shutil.rmtree(state, ignore_errors=True)


def _spec(state: Path, job: int, argv: list[str], attempt: int = 1) -> Spec:
    out = state / f"{job}.out"
    return Spec(job, attempt, tuple(argv), "/tmp", {"PATH": "/usr/bin:/bin"}, str(out), str(out))


async def test_spawn_wait_and_acknowledge() -> None:
    with state_dir() as (state, v2, v1):
        async with Keepers(state, v2, v1) as keepers:
            proc = await keepers.spawn("cpu", _spec(state, 1, ["sh", "-c", "exit 3"]))
            assert proc.record.cgroup == str(v2 / "keeper-cpu" / "job-1-1")
            status = await proc.wait()
            assert status is not None and status.exit_code == 3
            assert proc.ended is not None and exit_status(proc.ended) == status
            await proc.ack()
            with pytest.raises(SpawnError, match="executable not found: nope"):
                await keepers.spawn("cpu", _spec(state, 2, ["nope"]))


async def test_kill_tree_and_memory_of_a_running_job() -> None:
    with state_dir() as (state, v2, v1):
        async with Keepers(state, v2, v1) as keepers:
            proc = await keepers.spawn("gpu0", _spec(state, 1, ["sh", "-c", "sleep 1000 & wait"]))
            while len(pids := await proc.pids()) < 2:  # sh, then its sleep
                await anyio.sleep(0.01)
            assert proc.pid in pids
            peak, oom = await proc.memory()
            assert peak is not None and oom == 0
            assert sorted(proc.pids_now()) == sorted(pids)
            await proc.kill(5.0)
            status = await proc.wait()
            assert status is not None and status.signal == signal.SIGTERM
            assert not any(alive(p) for p in pids)


async def test_a_new_client_takes_back_running_jobs_and_exits_that_happened_meanwhile() -> None:
    with state_dir() as (state, v2, v1):
        fifo = state / "fifo"
        os.mkfifo(fifo)
        async with Keepers(state, v2, v1) as first:
            runs = await first.spawn("gpu0", _spec(state, 1, ["sleep", "1000"]))
            ends = await first.spawn(
                "gpu1", _spec(state, 2, ["sh", "-c", f"read x < {fifo}; exit 3"])
            )
        fifo.write_text("go\n")  # job 2 exits while no client is connected
        journal = state / "keepers" / "gpu1" / "journal"
        wait_for(lambda: '"e":"exit"' in journal.read_text(), "the exit on disk")
        async with Keepers(state, v2, v1) as second:
            keeper0, records0 = await second.ensure("gpu0")
            keeper1, records1 = await second.ensure("gpu1")
            assert [(r.job, r.pid, r.ended) for r in records0] == [(1, runs.pid, False)]
            assert [(r.job, r.pid, r.exit_code) for r in records1] == [(2, ends.pid, 3)]
            adopted = second.adopt(keeper0, records0[0])
            assert alive(adopted.pid)
            status = await second.adopt(keeper1, records1[0]).wait()
            assert status is not None and status.exit_code == 3
            await anyio.to_thread.run_sync(adopted.kill_tree, 5.0)  # as an abort thread does
            status = await adopted.wait()
            assert status is not None and status.signal == signal.SIGTERM


async def test_a_keeper_that_dies_fails_its_waiters() -> None:
    with state_dir() as (state, v2, v1):
        async with Keepers(state, v2, v1) as keepers:
            proc = await keepers.spawn("cpu", _spec(state, 1, ["sleep", "1000"]))
            os.kill(proc.keeper.pid, signal.SIGKILL)
            with pytest.raises(KeeperGone):
                await proc.wait()
            _, records = await keepers.ensure("cpu")  # a new keeper takes over
            assert records[0].lost and not alive(proc.pid)


async def test_an_exit_line_that_cannot_be_read_reaches_its_watcher_from_the_keepers_list() -> None:
    """The exit's line is garbled on its way in: the daemon skips it, reads the keeper's
    list again, and the watcher gets the exit from the journal; the connection stays."""
    with state_dir() as (state, v2, v1):
        async with Keepers(state, v2, v1) as keepers:
            keeper, _ = await keepers.ensure("cpu")
            fifo = state / "fifo"
            os.mkfifo(fifo)
            proc = await keepers.spawn(
                "cpu", _spec(state, 1, ["sh", "-c", f"read x < {fifo}; exit 3"])
            )
            real, garbled = keeper.wire.data_received, list[bytes]()

            def garble(data: bytes) -> None:
                if b'"exit"' in data and not garbled:
                    garbled.append(data)
                    data = data.replace(b'{"event"', b'{event"', 1)  # no longer JSON
                real(data)

            keeper.wire.data_received = garble  # type: ignore[method-assign]
            await anyio.to_thread.run_sync(fifo.write_text, "go\n")
            with anyio.fail_after(10):
                status = await proc.wait()
            assert garbled, "the exit line was never seen"
            assert status is not None and status.exit_code == 3
            assert not keeper.gone
            await proc.ack()
            again = await keepers.spawn("cpu", _spec(state, 2, ["true"]))  # the same connection
            assert again.keeper is keeper
            status = await again.wait()
            assert status is not None and status.exit_code == 0
