"""A real daemon, built and served in-process by the composition root (`build`, `serve`),
with one more listener on its broker that raises on every job change and every spawn:
a submit is answered with its job, the job runs to its end, the daemon keeps serving,
and the failures are counted in its metrics. Nothing in the daemon is made for this:
the broker is the composition root's own, reached through the parts it returns."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.client.cli import Client
from supervisor.core.commands import Changed, Spawn
from supervisor.daemon.config import load
from supervisor.daemon.life.app import build, serve
from supervisor.daemon.running.keeper_processes import abandon
from supervisor.gpus.release import release_backend


class Faulty(Exception):
    pass


def raises(_event: object) -> None:
    raise Faulty("a listener's bug")


async def call(socket: Path, request: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = await anyio.to_thread.run_sync(Client(socket).call, request)
    return reply


async def wait_done(socket: Path, job_id: int) -> dict[str, Any]:
    with anyio.fail_after(60):
        while True:
            job: dict[str, Any] = (await call(socket, {"type": "show", "ids": [job_id]}))["job"]
            if job["state"] in ("succeeded", "failed", "cancelled"):
                return job
            await anyio.sleep(0.05)


@pytest.fixture
def flags(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "kern.log").touch()
    return {
        "state_dir": str(tmp_path / "state"),
        "socket": str(tmp_path / "gpusvd.sock"),
        "simulate_gpus": "2x8G",
        "kernel_log": f"file:{tmp_path / 'kern.log'}",
    }


async def test_a_raising_listener_neither_stops_the_daemon_nor_fails_a_submit(
    tmp_path: Path, flags: dict[str, Any]
) -> None:
    env = {**os.environ, "GPUSV_TEST_ROOT": str(tmp_path)}
    cfg = load(None, flags=flags, env=env, uid=os.geteuid())
    parts = await build(cfg)
    parts.broker.subscribe(Changed, raises)
    parts.broker.subscribe(Spawn, raises)  # after the runner's: it spawns, then this raises
    socket = cfg.socket
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(serve, parts)
            request = {"type": "submit", "argv": ["true"], "cwd": str(tmp_path), "env": {}}
            reply = await call(socket, request)
            assert reply["ok"] and len(reply["ids"]) == 1, reply
            assert reply["job"]["id"] == reply["ids"][0]
            done = await wait_done(socket, reply["ids"][0])
            assert done["state"] == "succeeded", done
            second = await call(socket, request)  # still serving, still running jobs
            assert (await wait_done(socket, second["ids"][0]))["state"] == "succeeded"
            text = (await call(socket, {"type": "metrics"}))["text"]
            found = re.search(r"^gpusv_listener_errors_total (\S+)$", text, re.M)
            assert found is not None and float(found.group(1)) >= 4, text
            assert parts.broker.failures["Spawn"] == 2
            tg.cancel_scope.cancel()
    finally:
        parts.deadman.stop()
        with anyio.CancelScope(shield=True):  # as the composition root's `run` ends
            await parts.store.close()
            await release_backend(parts.monitor.backend)
        abandon(cfg.state_dir)
