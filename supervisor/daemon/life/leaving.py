"""Stop or restart: whether a SIGTERM should drain the jobs or leave them to their keepers.

systemd sends the same SIGTERM for `systemctl stop` and for the stop half of `systemctl
restart`; what tells them apart is the job systemd is running on the unit at that moment
(`systemctl list-jobs`: a restart stays a `restart` job until its stop half is done). A
stop drains: jobs are stopped and queued again. A restart only replaces the daemon: the
keepers hold the jobs and the next daemon takes them back, as after a crash.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import structlog

log = structlog.get_logger("gpusvd.leaving")

DEFAULT_UNIT = "gpusvd.service"
# Job types under which the unit is started again right after this stop.
RESTARTING = frozenset({"restart", "try-restart", "reload-or-start", "try-reload"})


def unit_of(cgroup_file: str) -> str | None:
    """The service this process belongs to, from a /proc/PID/cgroup text: the last path
    component that names a `.service` (with Delegate=yes the daemon sits in a leaf below
    it)."""
    for line in cgroup_file.splitlines():
        hierarchy, _, path = line.partition("::")
        if hierarchy != "0":
            continue
        units = [part for part in path.split("/") if part.endswith(".service")]
        return units[-1] if units else None
    return None


def pending_job(list_jobs: str, unit: str) -> str | None:
    """The type of the job systemd runs on `unit`, from `systemctl list-jobs --no-legend`
    output (columns: JOB UNIT TYPE STATE), or None when there is none."""
    for line in list_jobs.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == unit:
            return fields[2]
    return None


def restarting(env: dict[str, str] | None = None, proc_cgroup: Path | None = None) -> bool:
    """Whether systemd is restarting this daemon's unit right now. Off systemd (no
    INVOCATION_ID), or when systemctl cannot tell, the answer is no: draining is the safe
    side, it loses no job."""
    env = dict(os.environ) if env is None else env
    if "INVOCATION_ID" not in env:
        return False
    try:
        unit = unit_of((proc_cgroup or Path("/proc/self/cgroup")).read_text())
    except OSError:
        unit = None
    unit = unit or DEFAULT_UNIT
    try:
        out = subprocess.run(
            ["systemctl", "list-jobs", "--no-legend", "--no-pager", "--full"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot ask systemd for its job: draining", error=repr(exc))
        return False
    kind = pending_job(out, unit)
    log.info("systemd's job on the unit", unit=unit, job=kind)
    return kind in RESTARTING
