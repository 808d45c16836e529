#!/usr/bin/env bash
# Install gpusv into .venv, start gpusvd on two simulated GPUs (state under ./demo-state),
# run a job on them, show it, and leave the daemon running in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e .
export GPUSV_SOCKET="$PWD/demo-state/gpusvd.sock"
mkdir -p demo-state
.venv/bin/gpusvd --state-dir demo-state --simulate-gpus 2x24G --kernel-log off &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon' EXIT INT TERM
for _ in $(seq 100); do .venv/bin/gpusv list >/dev/null 2>&1 && break; sleep 0.1; done
id=$(.venv/bin/gpusv submit --name hello -- sh -c 'echo "hello from GPU $CUDA_VISIBLE_DEVICES"')
.venv/bin/gpusv wait "$id"
.venv/bin/gpusv logs "$id"
.venv/bin/gpusv gpus
echo
echo "gpusvd is running (pid $daemon). In another shell:"
echo "  export GPUSV_SOCKET=$GPUSV_SOCKET"
echo "  .venv/bin/gpusv submit -- nvidia-smi      # or any command"
echo "Press Ctrl-C to stop it."
wait $daemon
