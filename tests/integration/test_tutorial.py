"""docs/tutorial.md, run as written.

Every ```sh block after a `<!-- test -->` marker runs, in document order, in one bash
session (`set -euo pipefail`), so that `cd` and variables carry over as in a terminal.
The block after `<!-- test: daemon -->` is the "second terminal": the session starts it
in the background at that point and goes on once the daemon has logged `ready`; it is
stopped (SIGTERM, the drain) at the end. HOME is a temp dir, and the metrics port (9464
in the text) a free one, so that runs in parallel do not collide.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.daemon.running.keeper_processes import abandon

DOC = Path(__file__).parents[2] / "docs" / "tutorial.md"
BLOCK = re.compile(r"<!-- test(?P<daemon>: daemon)? -->\n```sh\n(?P<body>.*?)```", re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_script(text: str, log: Path, pidfile: Path) -> str:
    """The marked blocks as one script; the daemon block becomes a background job."""
    lines = ["set -euo pipefail -m"]  # -m: the daemon gets a process group of its own
    for match in BLOCK.finditer(text):
        body = match["body"]
        if match["daemon"]:
            lines += [
                f"( {body.strip()} ) > {log} 2>&1 &",
                f"echo $! > {pidfile}",
                f"for _ in $(seq 300); do grep -q ' ready ' {log} && break; sleep 0.1; done",
                f"grep -q ' ready ' {log}",
            ]
        else:
            lines.append(body)
    return "\n".join(lines)


def stop(pidfile: Path, root: Path) -> None:
    """SIGTERM the daemon's group and wait for the drain; nothing of the run may stay."""
    if not pidfile.exists():
        return
    pgid = int(pidfile.read_text())
    with_daemon = [p for p in psutil.process_iter() if _pgid(p) == pgid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        _, alive = psutil.wait_procs(with_daemon, timeout=20)
        if not alive:
            break
    for proc in psutil.process_iter(["environ"]):
        try:
            if (proc.info["environ"] or {}).get("GPUSV_TEST_ROOT") == str(root):
                proc.kill()
        except psutil.Error:
            continue


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


@pytest.fixture
def home() -> Iterator[Path]:
    """A short HOME: the keepers' sockets live under it, and pytest's own temporary paths
    (which grow with its run counter and xdist's worker name) can pass AF_UNIX's 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gpusv-tut-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_tutorial_runs_as_written(tmp_path: Path, home: Path) -> None:
    text = DOC.read_text().replace("9464", str(free_port()))
    markers = BLOCK.findall(text)
    assert sum(1 for daemon, _ in markers if daemon) == 1
    assert len(markers) >= 8, "the tutorial lost its tested blocks"
    assert text.count("<!-- test") == len(markers), "a marker is not followed by an sh block"
    log, pidfile = tmp_path / "gpusvd.log", tmp_path / "gpusvd.pid"
    env = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
        "GPUSV_TEST_ROOT": str(tmp_path),
    }
    env.pop("GPUSV_SOCKET", None)
    try:
        result = subprocess.run(
            ["bash", "-c", session_script(text, log, pidfile)],
            capture_output=True,
            text=True,
            env=env,
            cwd=home,
            timeout=120,
        )
    finally:
        stop(pidfile, tmp_path)
        abandon(home / "gpusv-play" / "state")  # its keepers' cgroups go too
    daemon_log = log.read_text() if log.exists() else ""
    assert result.returncode == 0, f"{result.stderr}\n--- stdout ---\n{result.stdout}\n{daemon_log}"
    out = result.stdout
    assert "hello from GPU 0" in out
    assert re.search(r"^3 +queued .*waiting for host RAM", out, re.M), out
    assert re.search(r"^reason +gpu_hang$", out, re.M), out
    assert re.search(r'^gpusv_gpu_hangs_total\{.*gpu="0".*\} 1\.0$', out, re.M), out
    assert re.search(r'^gpusv_jobs\{state="succeeded"\} 2\.0$', out, re.M), out
    assert "merged 20 scores" in out and "array 5: 20 indices: 20 succeeded" in out, out
    assert "working in " in out and "run exited 3" in out
    assert "wait exited 143" in out and re.search(r"^reason +timeout$", out, re.M), out
    # ID STATE USER GPUS CARDS EXIT TIME AGE NAME NOTE
    assert re.search(r"^\d+ +queued +\S+ +0 +- +- +- +\S+ +later +held", out, re.M), out
    assert re.search(r"^later$", out, re.M) and "faults found: 1" in out
    # The encode batch: one kind with no --mem-key, its second half held by the first's peaks.
    assert re.search(r'"mem_key": "python3[.\d]* encode\.py \*\.mp4 \*\.mkv#[0-9a-f]{8}"', out), out
    assert re.search(r'"runs": 2,?$', out, re.M), out
    assert len(re.findall(r"^\d+ +queued .*waiting for host RAM", out, re.M)) >= 3, out
    assert "(observed: 2 earlier runs peaked at" in out, out
    assert "\na.mkv\nb.mkv\nc.mkv\nd.mkv\ne.mkv\nf.mkv\n" in out, out
    assert "drained" in daemon_log  # Ctrl-C (here SIGTERM) drains
