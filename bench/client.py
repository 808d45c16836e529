"""The client's cost: `gpusv submit` and `gpusv list` wall time beside the bare interpreter."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .harness import BIN, PY, BenchDaemon, summary, time_command


def _import_ms(d: BenchDaemon) -> float:
    """supervisor.client.cli's cumulative import time, as `python -X importtime` reports it."""
    done = subprocess.run(
        [PY, "-X", "importtime", "-c", "import supervisor.client.cli"],
        env=d.env,
        capture_output=True,
        text=True,
        check=True,
    )
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| supervisor\.client\.cli$", line)
        if match:
            return round(int(match.group(1)) / 1000, 1)
    return float("nan")


def _to_request(d: BenchDaemon, runs: int) -> list[float]:
    """From the exec of `gpusv submit` until its request arrives: the CLI's own start-up,
    seen by a stand-in daemon (a socket that answers every request with one id)."""
    path = d.root / "startup.sock"
    arrivals: list[float] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        thread = threading.Thread(target=_answer, args=(server, runs + 1, arrivals), daemon=True)
        thread.start()
        sent = []
        for _ in range(runs + 1):  # the first warms the bytecode cache
            sent.append(time.time())
            argv = [str(BIN / "gpusv"), "--socket", str(path), "submit", "--", "true"]
            subprocess.run(argv, env=d.env, cwd=d.root, stdout=subprocess.DEVNULL, check=True)
        thread.join(10)
    Path(path).unlink(missing_ok=True)
    return [a - s for s, a in zip(sent, arrivals, strict=True)][1:]


def _answer(server: socket.socket, count: int, arrivals: list[float]) -> None:
    for _ in range(count):
        conn, _addr = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(1 << 20)
            arrivals.append(time.time())
            conn.sendall(b'{"ok":true,"ids":[1]}\n')


def measure_client(d: BenchDaemon, runs: int) -> dict[str, Any]:
    """p50/p95 wall (ms) of each command over `runs` runs against an idle daemon."""
    env, cwd = d.env, d.root
    out: dict[str, Any] = {
        "bare_interpreter": summary(time_command([PY, "-I", "-S", "-c", "pass"], env, runs, cwd)),
        "interpreter_with_site": summary(time_command([PY, "-c", "pass"], env, runs, cwd)),
    }
    for label, prefix in (
        ("gpusv", [str(BIN / "gpusv")]),
        ("module", [PY, "-m", "supervisor.client.cli"]),
    ):
        submit = [*prefix, "submit", "--gpus", "0", "--", "true"]
        out[f"{label}_submit"] = summary(time_command(submit, env, runs, cwd))
        out[f"{label}_list"] = summary(time_command([*prefix, "list"], env, runs, cwd))
    out["gpusv_submit_to_request"] = summary(_to_request(d, runs))
    out["cli_import_ms"] = _import_ms(d)
    return out
