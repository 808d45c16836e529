"""A private machine with a real systemd as PID 1, for the host suite.

`Machine.boot` makes a fresh cgroup, enters new pid, mount, uts, cgroup and network
namespaces in it (Slurm's ports never open on the host) and runs boot.sh there, which
mounts a private /proc, a read-only /sys and /proc/sys, a cgroup2 filesystem, overlays
over /etc, /var and /opt (their writes land in the work dir), a private /dev, /run and
/tmp, masks every unit that would touch the host, and execs systemd. Commands run
inside through `nsenter`, with a clean environment. `close` kills the namespace's PID 1
(the kernel then kills every process in the namespace), removes the cgroups and the work
dir: nothing outlives it, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
BOOT = HERE / "boot.sh"

MASKED = HERE / "masked-units.txt"

INSIDE_WORK = "/mnt"  # where boot.sh binds the work dir inside
PATH = "/opt/gpusv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


UNSHARE = ("unshare", "--cgroup", "--pid", "--fork", "--mount", "--uts", "--net")


class CannotBoot(Exception):
    """This machine cannot make the namespaces (not root, no unshare, no systemd)."""


def unified_mount() -> Path | None:
    for path in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (path / "cgroup.procs").exists() and (path / "cgroup.controllers").exists():
            return path
    return None


def why_not() -> str | None:
    """One line saying why no machine can be booted here, or None."""
    if os.geteuid() != 0:
        return "the host suite needs root (it makes pid, mount and cgroup namespaces)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"no {tool} on this machine"
    if not Path("/lib/systemd/systemd").exists():
        return "no /lib/systemd/systemd on this machine"
    if unified_mount() is None:
        return "no cgroup2 filesystem on this machine"
    probe = subprocess.run(
        [*UNSHARE, "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot make namespaces: {probe.stderr.strip() or probe.returncode}"
    return None


class Machine:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.cgroup: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0  # systemd's pid, as this side sees it

    # -- life ------------------------------------------------------------------------

    @classmethod
    def boot(cls, work: Path, timeout_s: float = 60.0) -> Machine:
        why = why_not()
        if why is not None:
            raise CannotBoot(why)
        machine = cls(work)
        try:
            machine._boot(timeout_s)
        except BaseException:
            machine.close()
            raise
        return machine

    def _boot(self, timeout_s: float) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        shutil.copy(MASKED, self.work / "masked")
        mount = unified_mount()
        assert mount is not None
        self.cgroup = mount / f"gpusv-host-{os.getpid()}-{time.monotonic_ns()}"
        self.cgroup.mkdir()
        procs = os.fsencode(self.cgroup / "cgroup.procs")

        def join() -> None:  # into the fresh cgroup before the namespaces are made
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        console = open(self.work / "console.log", "wb")  # noqa: SIM115 (kept by the child)
        with console:
            self.proc = subprocess.Popen(
                [*UNSHARE, "--propagation", "private", "bash", str(BOOT), str(self.work)],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                preexec_fn=join,
                start_new_session=True,
                env={"PATH": PATH, "LANG": "C.UTF-8"},
            )
        deadline = time.monotonic() + timeout_s
        while not self.pid:
            self._check_alive()
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            with contextlib.suppress(OSError):
                kids = children.read_text().split()
                if kids and Path(f"/proc/{kids[0]}/comm").read_text().strip() == "systemd":
                    self.pid = int(kids[0])
            if time.monotonic() > deadline:
                raise TimeoutError(f"systemd did not start: {self.console()}")
            time.sleep(0.05)
        while True:
            state = self.sh("systemctl is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"systemd is {state!r} after {timeout_s} s: {self.console()}")
            time.sleep(0.1)

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            code = self.proc.returncode
            raise RuntimeError(f"the machine's init exited {code}: {self.console()}")

    def console(self) -> str:
        with contextlib.suppress(OSError):
            return (self.work / "console.log").read_text(errors="replace")[-4000:]
        return ""

    def close(self) -> None:
        """Kill everything in the namespace, remove its cgroups and its files."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                # PID 1 of a pid namespace: its death kills every process in it.
                os.kill(self.pid or self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        if self.cgroup is not None:
            _remove_cgroup_tree(self.cgroup)
        shutil.rmtree(self.work, ignore_errors=True)

    # -- commands inside -------------------------------------------------------------

    def argv(self, script: str) -> list[str]:
        return [
            "nsenter",
            f"--target={self.pid}",
            "--mount",
            "--uts",
            "--pid",
            "--cgroup",
            "--net",
            "--",
            "env",
            "-i",
            f"PATH={PATH}",
            "LANG=C.UTF-8",
            "HOME=/root",
            "SYSTEMD_PAGER=",
            "SYSTEMD_COLORS=0",
            "bash",
            "-c",
            script,
        ]

    def sh(
        self, script: str, *, check: bool = True, timeout: float = 60.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a bash script inside the machine, as root; its output as text."""
        done = subprocess.run(
            self.argv(script),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{script!r} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def popen(self, script: str) -> subprocess.Popen[str]:
        """A script inside the machine, left running: its output read when it ends."""
        return subprocess.Popen(
            self.argv(script),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def path(self, inside: str) -> Path:
        """A path of the machine's file system, as this side reaches it."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def write(self, inside: str, text: str) -> None:
        target = self.path(inside)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def wait_for(self, check: Callable[[], object], what: str, timeout_s: float = 60.0) -> object:
        """Poll `check` until it returns something true; fail naming `what`."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.2)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} -p {','.join(props)}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *args: str) -> str:
        """journalctl's output, after the journal has taken every line sent so far."""
        self.sh("journalctl --sync", check=False)
        return self.sh("journalctl --no-pager -q " + " ".join(args), check=False).stdout


def _remove_cgroup_tree(root: Path) -> None:
    """rmdir, deepest first, until nothing is left (killed processes leave a little late)."""
    deadline = time.monotonic() + 30.0
    while root.exists() and time.monotonic() < deadline:
        for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda entry: -entry[0].count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        if root.exists():
            kill = root / "cgroup.kill"
            with contextlib.suppress(OSError):
                kill.write_text("1")
            time.sleep(0.1)
