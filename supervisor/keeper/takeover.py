"""At a keeper's start: the jobs of a keeper that died before it, and what its forks left.

A record with no end belongs to a keeper that died while the job ran: the new keeper is
not the job's parent and cannot learn its status, so it kills the job and records it
lost. A record with pid 0 is a posix_spawn start whose pid was never written: its
cgroup holds whatever of it started. A job cgroup with no record was left by a start
that was never recorded, and a probe group by a keeper killed while it probed: emptied
and removed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from . import cgroup, direct, pidfds, spawn
from .jobs import Jobs
from .journal import Record


def take_over(jobs: Jobs) -> None:
    for record in list(jobs.journal.records.values()):
        if record.ended:
            continue
        groups = jobs.groups(record)
        if groups.any:
            for path in (groups.v2, groups.memcg):
                if path is not None and os.path.exists(path):
                    cgroup.empty_out(path)
        else:
            _kill_orphan(record)
        peak, oom = cgroup.memory(groups)
        why = "its keeper died; killed"
        extra = {}
        if record.damaged:  # said, never silent: its exit may be in the damaged line
            why = "its journal line could not be read (damaged); taken as lost, killed"
            extra["error"] = "journal damaged: an exit of this attempt may have been lost"
        jobs.journal.append(
            "exit",
            record,
            ended_at=time.time(),
            lost=True,
            peak_bytes=peak,
            oom_kills=oom,
            **extra,
        )
        jobs.log(f"job {record.job} attempt {record.attempt}: {why}")
    _sweep_strays(jobs)
    jobs.journal.sync()


def _kill_orphan(record: Record) -> None:
    """Without a cgroup: the leader, through a pidfd, if it is still the process the
    record names (same start tick once the pidfd holds it), and its group while it
    lives and leads it. Never pid 0 (a start recorded before its process existed)."""
    fd = pidfds.open_pid(record.pid)
    if fd is None:
        return
    try:
        if spawn.start_ticks(record.pid) == record.start_ticks:
            pidfds.signal_group_of(fd, record.pid, signal.SIGKILL)
            pidfds.send(fd, signal.SIGKILL)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _sweep_strays(jobs: Jobs) -> None:
    known = {cgroup.name(*key) for key in jobs.journal.records}
    for root in (jobs.roots.v2, jobs.roots.memcg):
        if root is None or not os.path.isdir(root):
            continue
        for entry in os.scandir(root):
            job = entry.name.startswith("job-") and "-" in entry.name[4:]
            # A probe group is this keeper's own only once it probes, after this sweep:
            # any found now was left by a keeper killed while it probed.
            probe = entry.name.startswith(direct.PROBE_PREFIX)
            if (job or probe) and entry.is_dir() and entry.name not in known:
                cgroup.empty_out(entry.path)
                cgroup.remove(cgroup.Groups(entry.path))
