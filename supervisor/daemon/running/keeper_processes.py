"""A state dir's keeper processes, found by their command line, and letting them all go:
for whoever throws a whole state dir away (the benchmark, tests, an uninstall). A daemon
never calls these on its own keepers, which are meant to outlive it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil

from supervisor.daemon.running.keepers import cgroup_tag


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
        _wait_dead(found, timeout_s=5.0)
        quiet = 0 if found else quiet + 1
        time.sleep(0.05)
    for base in keeper_roots(cgroup_tag(state_dir)):
        if base is None or not base.exists():
            continue
        for keeper_root in (p for p in base.glob("keeper-*") if p.is_dir()):
            cgroup.remove_tree(keeper_root)
        base.rmdir()


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> None:
    """Until each is gone or a zombie: a killed keeper is nobody's child by design, and
    whoever reaps orphans here (init, a subreaper) may take its time; dead is enough."""
    deadline = time.monotonic() + timeout_s
    waiting = list(procs)
    while waiting and time.monotonic() < deadline:
        waiting = [p for p in waiting if _alive(p)]
        if waiting:
            time.sleep(0.01)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def keeper_processes(root: Path) -> list[psutil.Process]:
    """Keeper processes whose directory is under `root`."""
    prefixes = tuple({f"{root}/", f"{root.resolve()}/"})
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "supervisor.keeper" in cmdline and any(a.startswith(prefixes) for a in cmdline):
            found.append(proc)
    return found
