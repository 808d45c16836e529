"""Under systemd, each keeper lives in a transient scope unit of its own.

gpusvd's unit keeps its keepers (and so their jobs) out of its own cgroup: a restart of
the unit (`systemctl restart`, the deadman's exit 70, a watchdog abort, a crash) then
finds only the daemon there, and systemd has no "left-over process" of ours to report at
each start, nor a "remains running after unit stopped" at each end. It is what slurmd
does for its slurmstepd processes. The scope is asked of the service manager with
`systemd-run --scope` (its StartTransientUnit call: the keeper's start runs in the new
scope from its first instruction), named after the keeper and the state dir
(`gpusv-<tag>-keeper-<name>.scope`), in the daemon's own slice, with `Delegate=yes` so
that the keeper makes its jobs' cgroups inside (`<scope>/jobs/job-<id>-<attempt>`, the
keeper itself in `<scope>/keeper`), `TasksMax=infinity` as the unit has, and ordered
`Before=` the daemon's unit, so that at shutdown the daemon drains first.

A keeper whose scope exists already (it serves, or a keeper that died left jobs in it)
is started inside that scope's cgroup instead: its jobs' root stays where the jobs are.
Where there is no systemd, the daemon is no service's own process, or the manager
refuses, keepers start as before, beside the daemon. A gpusvd that is only a descendant
of a service (a private one in a Slurm job, whose cgroup v1 plugin leaves the job in
slurmd.service's cgroup2 group) must not ask for scopes: its keepers would leave the
allocation it was started in.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(): systemd is PID 1
KEEPER_LEAF = "keeper"  # the keeper's own cgroup inside its scope
JOBS_LEAF = "jobs"  # the root of its jobs' cgroups, beside it


@dataclass(frozen=True)
class Scope:
    unit: str  # gpusv-<tag>-keeper-<name>.scope
    slice: str  # the daemon's slice: system.slice, or a user manager's app.slice
    service: str  # the daemon's unit: gpusvd.service
    cgroup: Path  # where the scope's cgroup is (or will be)
    user: bool  # a user's service manager (systemd --user), not the system's

    @property
    def jobs_root(self) -> Path:
        return self.cgroup / JOBS_LEAF

    def join_target(self) -> Path:
        """The cgroup a keeper joins when the scope exists already: the keeper leaf when
        there is one (the scope's own group may have handed out controllers)."""
        leaf = self.cgroup / KEEPER_LEAF
        return leaf if leaf.is_dir() else self.cgroup

    def argv(self, systemd_run: str, command: list[str]) -> list[str]:
        return [
            systemd_run,
            *(["--user"] if self.user else []),
            "--scope",
            "--quiet",
            "--collect",
            f"--unit={self.unit}",
            f"--slice={self.slice}",
            f"--description=gpusv keeper ({self.service})",
            "--property=Delegate=yes",
            "--property=TasksMax=infinity",
            f"--property=Before={self.service}",
            "--",
            *command,
        ]


def service_main(
    pid: int | None = None, ppid: int | None = None, env: dict[str, str] | None = None
) -> bool:
    """Whether this process is the one its unit's manager started: the pid systemd put
    in SYSTEMD_EXEC_PID (248 and later), else, for an older systemd, a child of PID 1."""
    exec_pid = (os.environ if env is None else env).get("SYSTEMD_EXEC_PID")
    if exec_pid is not None:
        return exec_pid == str(os.getpid() if pid is None else pid)
    return (os.getppid() if ppid is None else ppid) == 1


def plan(
    cgroup2: Path | None,
    euid: int | None = None,
    running: Path = SYSTEMD_RUNNING,
    main: bool | None = None,
) -> Scope | None:
    """The scope for a keeper whose jobs' cgroups the daemon would put at `cgroup2`
    (`<unit's cgroup>/gpusv-<tag>/keeper-<name>`, daemon/cgroups.keeper_roots), or None
    where keepers stay beside the daemon: no cgroup there, systemd not PID 1, or the
    daemon not a service of the manager it may ask (root: the system's; a user: the
    one of its own user@UID.service), or not that service's own process (`main`, by
    default service_main())."""
    if cgroup2 is None or not running.is_dir():
        return None
    if not (service_main() if main is None else main):
        return None
    unit_dir = cgroup2.parent.parent
    slice_dir = unit_dir.parent
    if not unit_dir.name.endswith(".service") or not slice_dir.name.endswith(".slice"):
        return None
    uid = os.geteuid() if euid is None else euid
    user = uid != 0
    if user and f"user@{uid}.service" not in slice_dir.parts:
        return None
    name = f"{cgroup2.parent.name}-{cgroup2.name}.scope"
    return Scope(name, slice_dir.name, unit_dir.name, slice_dir / name, user)


def systemd_run() -> str | None:
    return shutil.which("systemd-run", path=os.environ.get("PATH") or "/usr/bin:/bin")


def move_into_leaf(root: Path, proc_cgroup: Path = Path("/proc/self/cgroup")) -> Path | None:
    """A keeper started in its scope sits in the scope's own cgroup, the parent of its
    jobs' `root`: it moves into the keeper leaf beside `root`, since cgroup v2 lets a
    group hand its children a controller (memory) only while it holds no process.
    Returns the leaf, or None where the keeper is not in `root`'s parent."""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return None
    own = next((line[3:].strip() for line in text.splitlines() if line.startswith("0::")), "")
    if own in ("", "/") or not str(root.parent).endswith(own):
        return None
    leaf = root.parent / KEEPER_LEAF
    leaf.mkdir(exist_ok=True)
    (leaf / "cgroup.procs").write_text(str(os.getpid()))
    return leaf
