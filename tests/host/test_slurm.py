"""A one-node Slurm (munged, slurmctld, slurmd under the machine's systemd) whose jobs
wrap `gpusv run`, as docs/scaling.md tells an operator to."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Iterator

import pytest

from .conftest import REPO, UNIT, Gpusvd
from .machine import Machine
from .test_systemd import XID_109_CARD0, go, waiter

SLURM_CONF = """\
ClusterName=gpusvhost
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/cgroup
SelectType=select/cons_tres
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=600
{health}
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
# slurmd sees the kernel's v1 hierarchies in /proc/self/cgroup beside the machine's
# cgroup2 and refuses that as "Hybrid mode"; the v1 plugin serves proctrack/linuxproc,
# and task/cgroup limits a job's memory (--mem) in the v1 memory hierarchy, mounted
# for it at V1_MOUNT (the machine's /sys/fs/cgroup is its cgroup2, which here has no
# memory controller to give).
V1_MOUNT = "/run/slurm-cgroup"
CGROUP_CONF = f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={V1_MOUNT}\nConstrainRAMSpace=yes\n"
HEALTH = "HealthCheckProgram=/etc/slurm/gpusv-healthcheck\nHealthCheckInterval=1\n"
HEALTH += "HealthCheckNodeState=ANY\n"


class Slurm:
    def __init__(self, m: Machine) -> None:
        self.m = m
        self.host = m.sh("hostname").stdout.strip()

    def configure(self, health: bool = False) -> None:
        conf = SLURM_CONF.format(host=self.host, health=HEALTH if health else "")
        self.m.write("/etc/slurm/slurm.conf", conf)
        self.m.write("/etc/slurm/cgroup.conf", CGROUP_CONF)

    def state(self) -> str:
        return self.m.sh(f"sinfo -h -n {self.host} -o %T").stdout.strip()

    def job(self, job: str) -> dict[str, str]:
        out = self.m.sh(f"scontrol -o show job {job}").stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_job(self, job: str, timeout_s: float = 90.0) -> dict[str, str]:
        def done() -> dict[str, str] | None:
            shown = self.job(job)
            return None if shown["JobState"] in ("PENDING", "RUNNING", "COMPLETING") else shown

        ended: dict[str, str] = self.m.wait_for(done, f"Slurm job {job} to end", timeout_s)  # type: ignore[assignment]
        return ended

    def sbatch(self, script: str, *flags: str) -> str:
        out = self.m.sh(f"sbatch --parsable {' '.join(flags)} --wrap {shlex.quote(script)}")
        return out.stdout.strip().split(";")[0]


@pytest.fixture(scope="session")
def slurm_node(machine: Machine) -> Iterator[Slurm]:
    sbin = "/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("slurmctld", path=sbin) is None or shutil.which("munged", path=sbin) is None:
        pytest.skip("Slurm is not installed: apt-get install slurmctld slurmd slurm-client munge")
    s = Slurm(machine)
    s.configure()
    machine.sh(
        "mkdir -p /var/lib/slurm/slurmctld /var/lib/slurm/slurmd && chown -R slurm: /var/lib/slurm"
    )
    machine.sh(f"mkdir -p {V1_MOUNT}/memory && mount -t cgroup -o memory cgroup {V1_MOUNT}/memory")
    try:
        machine.sh("systemctl start munge slurmctld slurmd", timeout=120)
        machine.wait_for(lambda: s.state() == "idle", "the Slurm node to be idle")
        yield s
    finally:
        machine.sh("systemctl stop slurmd slurmctld munge", check=False, timeout=120)
        # The hierarchy is the host's own: no group of Slurm's may outlive the suite.
        machine.sh(
            f"find {V1_MOUNT}/memory -mindepth 1 -depth -type d -exec rmdir {{}} + ; "
            f"umount {V1_MOUNT}/memory",
            check=False,
        )


@pytest.fixture
def slurm(slurm_node: Slurm, gpusvd: Gpusvd) -> Slurm:
    gpusvd.start()
    return slurm_node


def gpusv_job(gpusvd: Gpusvd) -> int:
    """The id of the one GPU job, once it runs."""

    def running() -> int | None:
        out = gpusvd.cli("list", "--state", "running", "--json").stdout
        ids = [int(i) for i in re.findall(r'"id": (\d+)', out)]
        return ids[0] if ids else None

    job: int = gpusvd.m.wait_for(running, "the GPU job to run")  # type: ignore[assignment]
    return job


def test_srun_gets_the_gpu_jobs_exit_code(slurm: Slurm) -> None:
    done = slurm.m.sh("srun gpusv run --retries 0 -- sh -c 'echo out; exit 5'", check=False)
    assert done.returncode == 5, done
    assert "out" in done.stdout


def test_scancel_cancels_the_gpu_job(slurm: Slurm, gpusvd: Gpusvd) -> None:
    job = slurm.sbatch("exec gpusv run --gpus 1 -- sleep 300")
    gpu_job = gpusv_job(gpusvd)
    slurm.m.sh(f"scancel {job}")
    assert gpusvd.wait_state(gpu_job, "cancelled")["state"] == "cancelled"
    assert slurm.wait_job(job)["JobState"] == "CANCELLED"


def test_slurms_time_limit_ends_the_gpu_job(slurm: Slurm, gpusvd: Gpusvd) -> None:
    job = slurm.sbatch("exec gpusv run --gpus 1 -- sleep 300", "--time=0:02", "--signal=TERM@1")
    gpu_job = gpusv_job(gpusvd)
    ended = slurm.wait_job(job, timeout_s=120)
    assert ended["JobState"] == "TIMEOUT", ended
    assert gpusvd.wait_state(gpu_job, "cancelled", "failed")["state"] == "cancelled"


@pytest.mark.parametrize("how", ["restart", "deadman"])
def test_a_slurm_job_wrapping_gpusv_run_rides_through_a_restart(
    slurm: Slurm, gpusvd: Gpusvd, how: str
) -> None:
    if how == "deadman":
        gpusvd.configure("[deadman]\nabort_deadline_s = 3\n", dropin="[Service]\nRestartSec=1\n")
        gpusvd.m.sh(f"systemctl restart {UNIT}", timeout=120)
    script = f"echo first; {waiter('slurm', 6)}"
    job = slurm.sbatch(f"exec gpusv run --gpus 1 --retries 0 -- sh -c {shlex.quote(script)}")
    gpu_job = gpusv_job(gpusvd)
    old = gpusvd.main_pid()
    if how == "restart":
        gpusvd.m.sh(f"systemctl restart {UNIT}", timeout=120)
    else:
        wedged = gpusvd.submit("sleep", "300", gpus=1)  # on the other card
        gpusvd.wait_pid(wedged)
        card = gpusvd.show(wedged)["gpus"][0]
        gpusvd.wedge(card, True)
        gpusvd.kernel_line(XID_109_CARD0.replace("0000:01:00", f"0000:{card + 1:02x}:00"))
        gpusvd.m.wait_for(lambda: "status=70" in gpusvd.journal(), "exit 70", 90)
        gpusvd.wedge(card, False)
    gpusvd.wait_active(other_than=old, timeout_s=90)
    assert gpusvd.show(gpu_job)["state"] == "running"
    assert slurm.job(job)["JobState"] == "RUNNING"
    go(gpusvd, "slurm")
    ended = slurm.wait_job(job)
    assert ended["ExitCode"] == "6:0", ended
    assert gpusvd.wait_state(gpu_job, "failed")["exit_code"] == 6
    out = slurm.m.sh(f"cat /slurm-{job}.out", check=False).stdout
    assert out.count("first") == 1, out


def test_gpusv_health_as_health_check_program_drains_and_resumes_the_node(
    slurm: Slurm, gpusvd: Gpusvd
) -> None:
    docs = (REPO / "docs/scaling.md").read_text()
    program = docs.split("# /etc/slurm/gpusv-healthcheck", 1)[1].split("```", 1)[0]
    resume = docs.split("in the\n`0)` branch:\n\n```sh\n", 1)[1].split("```", 1)[0]
    program = program.replace("  0)   exit 0 ;;\n", resume)
    slurm.m.write("/etc/slurm/gpusv-healthcheck", "#!/bin/sh\n" + program)
    slurm.m.sh("chmod 755 /etc/slurm/gpusv-healthcheck")
    slurm.configure(health=True)
    try:
        slurm.m.sh("scontrol reconfigure")
        slurm.m.sh(f"systemctl stop {UNIT}", timeout=150)
        slurm.m.wait_for(lambda: "drain" in slurm.state(), "the node to drain")
        reason = slurm.m.sh(f"sinfo -h -R -n {slurm.host} -o %E").stdout
        assert "gpusv: gpusvd is not running" in reason, reason
        gpusvd.start()
        slurm.m.wait_for(lambda: slurm.state() == "idle", "the node to resume")
    finally:
        slurm.configure()
        slurm.m.sh("scontrol reconfigure", check=False)
        slurm.m.sh(f"scontrol update nodename={slurm.host} state=resume", check=False)


def test_a_private_gpusvd_in_an_allocation_admits_against_its_memory_limit(
    slurm: Slurm, gpusvd: Gpusvd
) -> None:
    """docs/scaling.md's batch script in a 400 MiB allocation on a 24 GiB machine: two
    300 MiB jobs on two free cards run one after the other, held for host RAM."""
    slurm.m.sh("rm -rf /tmp/alloc-* /tmp/gpusv-*")
    docs = (REPO / "docs/scaling.md").read_text()
    script = docs.split("A Slurm batch job running a private gpusvd", 1)[1]
    script = script.split("```sh\n", 1)[1].split("```", 1)[0]
    sweep = "gpusv submit --wait --batch sweep.txt --gpus 1 --mem 24G\n"
    line = 'sh -c "cat /proc/self/cgroup >> /tmp/alloc-cgroups; sleep 2"'
    assert sweep in script
    script = script.replace(
        sweep,
        f"printf '{line}\\n{line}\\n' > sweep.txt\n"
        "gpusv metrics > /tmp/alloc-metrics.txt\n"
        "gpusv submit --batch sweep.txt --gpus 1 --mem 300M > ids.txt\n"
        "for i in $(seq 100); do gpusv list --json > /tmp/alloc-held.json\n"
        "  grep -q 'waiting for host RAM' /tmp/alloc-held.json && break; sleep 0.1; done\n"
        "gpusv wait $(cat ids.txt)\n"
        "gpusv list --all --json > /tmp/alloc-list.json\n",
    )
    daemon = "--kernel-log off &\n"
    assert daemon in script
    script = script.replace(daemon, "--kernel-log off --simulate-gpus 2x24G &\n")  # no cards here
    slurm.m.write("/tmp/alloc.sh", script)
    job = slurm.sbatch("sh /tmp/alloc.sh", "--mem=400", "--chdir=/tmp")
    ended = slurm.wait_job(job, timeout_s=120)
    out = slurm.m.sh(f"cat /tmp/slurm-{job}.out", check=False).stdout
    assert ended["ExitCode"] == "0:0", out
    metrics = slurm.m.sh("cat /tmp/alloc-metrics.txt").stdout
    limit = re.search(r"^gpusv_host_memory_limit_bytes (\S+)$", metrics, re.M)
    assert limit is not None, metrics
    assert 0 < float(limit[1]) <= 400 * 1024 * 1024, limit[0]
    held = json.loads(slurm.m.sh("cat /tmp/alloc-held.json").stdout)
    why = [j["waiting_for"] for j in held if j["waiting_for"]]
    assert len(why) == 1 and why[0].startswith("waiting for host RAM: needs ~0.3 GiB"), held
    jobs = json.loads(slurm.m.sh("cat /tmp/alloc-list.json").stdout)
    spans = sorted((j["started_at"], j["ended_at"]) for j in jobs)
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded"], out
    assert spans[0][1] <= spans[1][0], f"ran side by side in 400 MiB: {spans}"
    assert all(j["exit_code"] == 0 for j in jobs), out
    # Both the v1 memory group and the cgroup2 group are the allocation's (slurmd's, for
    # the v1 plugin): no job of a private gpusvd leaves them for a scope of its own.
    groups = slurm.m.sh("cat /tmp/alloc-cgroups").stdout.splitlines()
    memory = [g for g in groups if ":memory:" in g]
    unified = [g for g in groups if g.startswith("0::")]
    assert len(memory) == 2 and all(f"/job_{job}/" in g for g in memory), groups
    assert len(unified) == 2 and all("/slurmd.service/" in g for g in unified), groups
