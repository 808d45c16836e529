#!/usr/bin/env bash
# The host suite: gpusv installed as an operator would, under a real systemd as PID 1
# booted in private pid, mount, uts and cgroup namespaces, and a real one-node Slurm
# (tests/host/, docs/testing.md). Needs root; skips with one line where the machine
# cannot make namespaces. Nothing it starts outlives it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/pytest ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
fi
# Debian's Slurm, for its one-node cluster, installed when missing (as root, with apt);
# no daemon of it starts on this host while it installs. Its tests skip if it cannot be.
if [ "$(id -u)" = 0 ] && ! command -v slurmctld >/dev/null && command -v apt-get >/dev/null; then
    made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge \
        >/dev/null || echo "test-host.sh: Slurm could not be installed; its tests skip" >&2
    if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
export GPUSV_HOST_SUITE=1
exec .venv/bin/pytest tests/host -p no:randomly -p no:xdist -q -rs --timeout=300 "$@"
