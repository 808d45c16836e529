"""The client's cost: `gpusv submit` and `gpusv list` wall time beside the bare interpreter,
from the venv the bench runs in (an editable install, as a checkout has it) and from a
venv where gpusv is laid out as installing its wheel would."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import supervisor

from .harness import BIN, PY, BenchDaemon, summary


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


def _to_request(d: BenchDaemon, runs: int, gpusv: str = str(BIN / "gpusv")) -> list[float]:
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
            argv = [gpusv, "--socket", str(path), "submit", "--", "true"]
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


def installed_venv(root: Path) -> Path:
    """A fresh venv with gpusv laid out as installing its wheel would: the package in
    site-packages and the checkout's bin/gpusv with its first line pointed at the new
    venv's interpreter (what pip does to a wheel's `#!python` script). Copied, not built:
    building a wheel here would need the network. No editable import hook runs at its
    start. Without pip: ensurepip takes seconds, and setuptools' .pth in a venv that has
    it adds ~0.5 ms."""
    venv = root / "installed"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    package = Path(supervisor.__file__).parent
    shutil.copytree(package, site / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    body = (package.parent / "bin" / "gpusv").read_text().splitlines(keepends=True)[1:]
    script = venv / "bin" / "gpusv"
    script.write_text(f"#!{venv / 'bin' / 'python3'}\n" + "".join(body))
    script.chmod(0o755)
    return venv


def measure_client(d: BenchDaemon, runs: int, warmup: int = 2) -> dict[str, Any]:
    """p50/p95 wall (ms) of each command over `runs` runs against an idle daemon, and the
    p50 of its CPU (user + system, ms), the figure a loaded machine disturbs least. The
    commands take turns run by run, so that a change in the machine's load falls on all
    of them alike and the differences between them hold."""
    env, cwd = d.env, d.root
    installed = str(installed_venv(d.root) / "bin" / "gpusv")
    g = str(BIN / "gpusv")
    commands = {
        "bare_interpreter": [PY, "-I", "-S", "-c", "pass"],
        "interpreter_with_site": [PY, "-c", "pass"],
        "installed_interpreter_with_site": [str(Path(installed).parent / "python3"), "-c", "pass"],
        "gpusv_submit": [g, "submit", "--gpus", "0", "--", "true"],
        "gpusv_list": [g, "list"],
        "installed_list": [installed, "list"],
        "module_submit": [PY, "-m", "supervisor.client.cli", "submit", "--gpus", "0", "--", "true"],
        "module_list": [PY, "-m", "supervisor.client.cli", "list"],
        "installed_submit": [installed, "submit", "--gpus", "0", "--", "true"],
        "installed_submit_wait": [installed, "submit", "--gpus", "0", "--wait", "--", "true"],
        "installed_run": [installed, "run", "--gpus", "0", "--", "true"],
    }
    walls: dict[str, list[float]] = {key: [] for key in commands}
    cpus: dict[str, list[float]] = {key: [] for key in commands}
    for i in range(warmup + runs):
        for key, argv in commands.items():
            wall, cpu = _timed(argv, env, cwd)
            if i >= warmup:
                walls[key].append(wall)
                cpus[key].append(cpu)
    out: dict[str, Any] = {}
    for key in commands:
        out[key] = {**summary(walls[key]), "cpu_p50": summary(cpus[key])["p50"]}
    out["gpusv_submit_to_request"] = summary(_to_request(d, runs))
    # The installed client's share of a submit's wall, without the daemon's answer.
    out["installed_submit_to_request"] = summary(_to_request(d, runs, installed))
    out["cli_import_ms"] = _import_ms(d)
    return out


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (the child's user + system) of one run of `argv`."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime
