"""Where a keeper lives under systemd: the scope planned for it, from the daemon's cgroup."""

from __future__ import annotations

from pathlib import Path

from supervisor.keeper import scope

UNIT = Path("/sys/fs/cgroup/system.slice/gpusvd.service")


def test_a_root_service_gets_a_scope_in_its_slice_named_after_the_keeper(tmp_path: Path) -> None:
    planned = scope.plan(UNIT / "gpusv-abc" / "keeper-gpu0", euid=0, running=tmp_path, main=True)
    assert planned == scope.Scope(
        unit="gpusv-abc-keeper-gpu0.scope",
        slice="system.slice",
        service="gpusvd.service",
        cgroup=Path("/sys/fs/cgroup/system.slice/gpusv-abc-keeper-gpu0.scope"),
        user=False,
    )
    assert planned.jobs_root == planned.cgroup / "jobs"
    argv = planned.argv("/usr/bin/systemd-run", ["python", "-m", "supervisor.keeper"])
    assert argv[:3] == ["/usr/bin/systemd-run", "--scope", "--quiet"]
    assert "--property=Delegate=yes" in argv and "--property=TasksMax=infinity" in argv
    assert "--property=Before=gpusvd.service" in argv
    assert argv[-4:] == ["--", "python", "-m", "supervisor.keeper"]


def test_a_users_own_service_asks_its_own_manager(tmp_path: Path) -> None:
    unit = Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice")
    planned = scope.plan(
        unit / "gpusvd.service" / "gpusv-abc" / "keeper-cpu", 1000, tmp_path, main=True
    )
    assert planned is not None and planned.user and planned.slice == "app.slice"
    assert planned.argv("systemd-run", ["x"])[1:3] == ["--user", "--scope"]
    assert (
        scope.plan(unit / "gpusvd.service" / "gpusv-abc" / "keeper-cpu", 1001, tmp_path, main=True)
        is None
    )


def test_no_scope_without_systemd_a_cgroup_or_a_service(tmp_path: Path) -> None:
    root = UNIT / "gpusv-abc" / "keeper-gpu0"
    assert scope.plan(root, euid=0, running=tmp_path / "absent") is None
    assert scope.plan(None, euid=0, running=tmp_path, main=True) is None
    a_shell = Path("/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope/gpusv-abc/keeper-gpu0")
    assert scope.plan(a_shell, euid=0, running=tmp_path, main=True) is None


def test_a_daemon_that_only_descends_from_a_service_stays_where_it_was_started(
    tmp_path: Path,
) -> None:
    """A private gpusvd in a Slurm job of a cgroup v1 plugin: its cgroup2 group is
    slurmd.service's; a scope would take its keepers out of the allocation."""
    inside = Path("/sys/fs/cgroup/system.slice/slurmd.service/gpusv-abc/keeper-gpu0")
    assert scope.plan(inside, euid=0, running=tmp_path, main=False) is None
    assert scope.plan(inside, euid=0, running=tmp_path, main=True) is not None


def test_the_main_process_of_a_unit() -> None:
    assert scope.service_main(pid=42, ppid=7, env={"SYSTEMD_EXEC_PID": "42"})
    assert not scope.service_main(pid=43, ppid=1, env={"SYSTEMD_EXEC_PID": "42"})
    assert scope.service_main(pid=43, ppid=1, env={})  # systemd before 248
    assert not scope.service_main(pid=43, ppid=17, env={})


def test_a_keeper_in_its_scope_moves_into_the_leaf_beside_its_jobs(tmp_path: Path) -> None:
    cgroup = tmp_path / "system.slice" / "gpusv-abc-keeper-gpu0.scope"
    cgroup.mkdir(parents=True)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/gpusv-abc-keeper-gpu0.scope\n")
    leaf = scope.move_into_leaf(cgroup / "jobs", proc_cgroup=proc)
    assert leaf == cgroup / "keeper"
    assert (leaf / "cgroup.procs").read_text().strip().isdigit()
    proc.write_text("0::/system.slice/gpusvd.service/daemon\n")
    assert scope.move_into_leaf(cgroup / "jobs", proc_cgroup=proc) is None
