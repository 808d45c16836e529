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
export GPUSV_HOST_SUITE=1
exec .venv/bin/pytest tests/host -p no:randomly -p no:xdist -q -rs --timeout=300 "$@"
