"""The host suite's fixtures: one machine booted with a real systemd for the session, the
package installed into it as an operator would (a venv in /opt/gpusv, `pip install`
from this working tree, the unit from systemd/ in /etc/systemd/system), and a fresh
gpusvd for each test. Only scripts/test-host.sh runs these tests (tests/conftest.py
leaves tests/host out of every other run)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .machine import INSIDE_WORK, CannotBoot, Machine

REPO = Path(__file__).resolve().parents[2]
UNIT = "gpusvd"
CONFIG = "/etc/gpusvd.toml"
KERNEL_LOG = "/var/log/gpusv-kern.log"
STATE = "/var/lib/gpusvd"
PYTHON = "/usr/bin/python3"  # the system's own, as an operator would use

BASE_CONFIG = f"""\
simulate_gpus = "2x24G"
kernel_log = "file:{KERNEL_LOG}"
cpu_slots = 2
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    alone = os.environ.get("GPUSV_HOST_SUITE") != "1"
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.host)
            if alone:  # named on a command line without the script
                item.add_marker(pytest.mark.skip(reason="run by scripts/test-host.sh"))


@pytest.fixture(scope="session")
def machine() -> Iterator[Machine]:
    work = Path(tempfile.mkdtemp(prefix="gpusv-host-", dir="/var/tmp"))
    try:
        booted = Machine.boot(work)
    except CannotBoot as exc:
        pytest.skip(f"no host machine: {exc}")
    try:
        _install(booted)
        yield booted
    finally:
        booted.close()


def _install(m: Machine) -> None:
    """As docs/operations.md says: a venv in /opt/gpusv, the package, the unit. The
    machine has no network: the wheels are made here, and reach it in its work dir."""
    wheels = m.work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    m.sh(
        f"{PYTHON} -m venv /opt/gpusv && /opt/gpusv/bin/pip install -q "
        f"--disable-pip-version-check --no-index --find-links {INSIDE_WORK}/wheels gpusv",
        timeout=300,
    )
    # The checkout may lie under /tmp, which the machine has a private one of: the unit
    # reaches it through the work dir, as the wheels do.
    shutil.copy(REPO / "systemd/gpusvd.service", m.work / "gpusvd.service")
    m.sh(f"install -m 644 {INSIDE_WORK}/gpusvd.service /etc/systemd/system/")
    m.sh("systemctl daemon-reload")


class Gpusvd:
    """The installed gpusvd under the machine's systemd, and the CLI beside it."""

    def __init__(self, m: Machine) -> None:
        self.m = m
        self.cursor = ""

    def mark_journal(self) -> None:
        """From here on, `journal` shows only what is logged after this call."""
        self.m.sh("journalctl --sync", check=False)
        out = self.m.sh("journalctl -q -n 0 --show-cursor", check=False).stdout
        self.cursor = out.rsplit("-- cursor: ", 1)[-1].strip() if "cursor" in out else ""

    def journal(self, *args: str) -> str:
        """The unit's journal since mark_journal, with `args` (fields, -o json...)."""
        after = f"--after-cursor={shlex.quote(self.cursor)}" if self.cursor else ""
        return self.m.journal(f"-u {UNIT}", after, *args)

    def configure(self, extra: str = "", dropin: str = "") -> None:
        self.m.write(CONFIG, BASE_CONFIG + extra)
        self.m.write(KERNEL_LOG, "")
        dropin_dir = f"/etc/systemd/system/{UNIT}.service.d"
        self.m.sh(f"rm -rf {dropin_dir}")
        if dropin:
            self.m.write(f"{dropin_dir}/test.conf", dropin)
        self.m.sh("systemctl daemon-reload")

    def start(self) -> None:
        self.m.sh(f"systemctl start {UNIT}", timeout=120)

    def cli(self, *args: str, check: bool = True, timeout: float = 60.0) -> Any:
        return self.m.sh(
            "gpusv " + " ".join(shlex.quote(a) for a in args), check=check, timeout=timeout
        )

    def submit(self, *command: str, gpus: int | None = None, extra: tuple[str, ...] = ()) -> int:
        flags = [] if gpus is None else ["--gpus", str(gpus)]
        out = self.cli("submit", "--json", *flags, *extra, "--", *command).stdout
        return int(json.loads(out)["id"])

    def show(self, job: int) -> dict[str, Any]:
        shown: dict[str, Any] = json.loads(self.cli("show", "--json", str(job)).stdout)
        return shown

    def wait_state(self, job: int, *states: str, timeout_s: float = 60.0) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            shown = self.show(job)
            return shown if shown["state"] in states else None

        found: dict[str, Any] = self.m.wait_for(  # type: ignore[assignment]
            reached, f"job {job} to be {'/'.join(states)}", timeout_s
        )
        return found

    def wait_pid(self, job: int, timeout_s: float = 60.0) -> int:
        def started() -> int | None:
            attempts = self.show(job)["attempts"]
            return attempts[-1]["pid"] if attempts and attempts[-1]["pid"] else None

        pid: int = self.m.wait_for(started, f"job {job} to start", timeout_s)  # type: ignore[assignment]
        return pid

    def main_pid(self) -> int:
        return int(self.m.show(UNIT, "MainPID")["MainPID"])

    def wait_active(self, other_than: int = 0, timeout_s: float = 60.0) -> int:
        """Until the unit is active with a main pid (other than `other_than`): that pid."""

        def active() -> int | None:
            props = self.m.show(UNIT, "ActiveState", "SubState", "MainPID")
            pid = int(props.get("MainPID", "0"))
            running = props.get("ActiveState") == "active" and props.get("SubState") == "running"
            return pid if running and pid and pid != other_than else None

        pid: int = self.m.wait_for(active, "gpusvd to be active", timeout_s)  # type: ignore[assignment]
        return pid

    def wedge(self, card: int, wedged: bool) -> None:
        self.m.sh(
            f"/opt/gpusv/bin/python -c 'from pathlib import Path; "
            f"from supervisor.gpus.simulated import write_control; "
            f'write_control(Path("{STATE}"), {card}, wedged={wedged})\''
        )

    def kernel_line(self, line: str) -> None:
        self.m.sh(f"echo {shlex.quote(line)} >> {KERNEL_LOG}")

    def cgroup_of(self, pid: int) -> str:
        return self.m.sh(f"cat /proc/{pid}/cgroup").stdout.strip()

    def stop_and_clean(self) -> None:
        """Stop the unit and everything it left; the state dir is removed."""
        self.m.sh(f"systemctl stop {UNIT}", check=False, timeout=150)
        self.m.sh(f"systemctl reset-failed {UNIT}", check=False)
        self.m.sh(
            f"systemctl kill --kill-whom=all -s KILL {UNIT}; "
            "for s in $(systemctl list-units --plain --no-legend 'gpusv-*.scope' | "
            "awk '{print $1}'); do systemctl kill -s KILL $s; systemctl stop $s; done; "
            f"rm -rf {STATE} /run/gpusvd /tmp/go-* /tmp/ran-*",
            check=False,
        )


@pytest.fixture
def gpusvd(machine: Machine) -> Iterator[Gpusvd]:
    d = Gpusvd(machine)
    d.stop_and_clean()
    d.configure()
    d.mark_journal()
    try:
        yield d
    finally:
        d.stop_and_clean()
