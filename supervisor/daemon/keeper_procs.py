"""A state dir's keeper processes, found by their command line, and letting them all go:
for whoever throws a whole state dir away (the benchmark, tests, an uninstall). A daemon
never calls these on its own keepers, which are meant to outlive it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil

from supervisor.daemon.keepers import cgroup_tag


def abandon(state_dir: Path) -> None:
    """Kill every keeper of `state_dir` and every job they hold, and remove their cgroups:
    for whoever throws a whole state dir away (the benchmark, tests). A daemon never
    calls this: its keepers are meant to outlive it."""
    from supervisor.daemon.cgroups import keeper_roots
    from supervisor.keeper import cgroup

    # By their command line, not their sockets: a keeper that a killed daemon was still
    # launching has no socket yet, and would come up after we looked. Look until two
    # looks a little apart find none.
    quiet = 0
    deadline = time.monotonic() + 10.0
    while quiet < 2 and time.monotonic() < deadline:
        found = keeper_processes(state_dir / "keepers")
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(found, timeout=5.0)
        quiet = 0 if found else quiet + 1
        time.sleep(0.1)
    for base in keeper_roots(cgroup_tag(state_dir)):
        if base is None or not base.exists():
            continue
        for keeper_root in (p for p in base.glob("keeper-*") if p.is_dir()):
            for group in (p for p in keeper_root.glob("job-*") if p.is_dir()):
                cgroup.empty_out(group)
                group.rmdir()
            keeper_root.rmdir()
        base.rmdir()


def keeper_processes(root: Path) -> list[psutil.Process]:
    """Keeper processes whose directory is under `root`."""
    prefixes = tuple({f"{root}/", f"{root.resolve()}/"})
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "supervisor.keeper" in cmdline and any(a.startswith(prefixes) for a in cmdline):
            found.append(proc)
    return found
