#!/usr/bin/env bash
# Exercise gpusv's real NVML backend on a machine with NVIDIA GPUs: one line per check,
# "ok" or "FAIL", exit 1 if any check failed. Nothing is simulated here.
#
#   scripts/gpu-check.sh            # uses .venv (created by scripts/test.sh)
#
# Checks: NVML discovery, UUIDs, VRAM, utilization, a job bound to one card that prints
# what CUDA sees (through a real gpusvd on a scratch state dir), and Xid event registration.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
failed=0
say() { printf '%-4s %-13s %s\n' "$1" "$2" "$3"; [ "$1" = ok ] || failed=1; }

out=$("$PY" - <<'EOF' 2>&1
import sys
from supervisor.gpus.nvml import NvmlBackend, NvmlUnavailable
from supervisor.gpus.nvml_events import xid_event_sources

try:
    backend = NvmlBackend()
except NvmlUnavailable as e:
    print(f"FAIL discover NVML unusable: {e}")
    sys.exit(0)
cards = backend.discover()
ok = cards and all(c.health == "ok" for c in cards)
print(f"{'ok' if ok else 'FAIL'} discover {len(cards)} card(s): "
      + ", ".join(f"{c.index}={c.pci_bus_id} {c.name} {c.health}" for c in cards))
uuids = [c.uuid for c in cards]
ok = bool(uuids) and all(u.startswith("GPU-") for u in uuids) and len(set(uuids)) == len(uuids)
print(f"{'ok' if ok else 'FAIL'} uuid {','.join(uuids) or 'none'}")
ok = all(c.vram_total_mb > 0 and 0 <= c.vram_used_mb <= c.vram_total_mb for c in cards)
print(f"{'ok' if ok else 'FAIL'} vram "
      + ", ".join(f"{c.vram_used_mb}/{c.vram_total_mb} MiB" for c in cards))
utils = [backend.query(c.index).utilization_pct for c in cards]
ok = all(u is None or 0 <= u <= 100 for u in utils)
print(f"{'ok' if ok else 'FAIL'} utilization "
      + ", ".join("unknown" if u is None else f"{u:.0f}%" for u in utils)
      + (" (MIG: " + ",".join(str(c.index) for c in cards if c.mig) + ")" if any(c.mig for c in cards) else ""))
events = xid_event_sources(backend)
for e in events:
    e.stop.set()  # register, then return after one wait
    e.run(lambda text: None)
n = sum(e.registered for e in events)
print(f"{'ok' if n == len(cards) else 'FAIL'} xid-events registered on {n} of {len(cards)} card(s)")
backend.close()
EOF
)
while read -r status name rest; do say "$status" "$name" "$rest"; done <<<"$out"
if [[ "$out" != ok\ discover* ]]; then
    say FAIL cuda-job "skipped: no NVIDIA card to bind a job to"
    exit 1
fi

# A job bound to the last card, through a real daemon: what CUDA sees.
tmp=$(mktemp -d)
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -rf "$tmp"' EXIT
"$PY" -m supervisor.daemon.life.app --state-dir "$tmp/state" --socket "$tmp/sock" \
    --kernel-log off >"$tmp/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do "$PY" -m supervisor.client.cli --socket "$tmp/sock" gpus >/dev/null 2>&1 && break; sleep 0.1; done
probe='import ctypes, os
cuda = ctypes.CDLL("libcuda.so.1"); n = ctypes.c_int(0)
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0
names = []
for i in range(n.value):
    d = ctypes.c_int(); buf = ctypes.create_string_buffer(100)
    cuda.cuDeviceGet(ctypes.byref(d), i); cuda.cuDeviceGetName(buf, 100, d)
    bus = ctypes.create_string_buffer(32); cuda.cuDeviceGetPCIBusId(bus, 32, d)
    names.append(f"{buf.value.decode()}@{bus.value.decode().lower()}")
print(f"CUDA_VISIBLE_DEVICES={os.environ.get(\"CUDA_VISIBLE_DEVICES\")} sees {n.value}: {names}")'
job=$(timeout 120 "$PY" -m supervisor.client.cli --socket "$tmp/sock" submit --gpus 1 --wait -- "$PY" -c "$probe" 2>&1)
log=$(cat "$tmp/state/logs/"*out* 2>/dev/null | tail -n 1)
if [[ "$log" == *"sees 1:"* ]]; then say ok cuda-job "$log"; else say FAIL cuda-job "${log:-$job}"; fi
exit "$failed"
