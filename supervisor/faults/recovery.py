"""NVIDIA's GPU recovery actions: what an Xid 154 line says the card needs now.

`NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU
Reset Required)`. The names are NVIDIA/open-gpu-kernel-modules gpu.c
`_gpuRecoveryActionName`, the numbers NVML's `nvmlDeviceGpuRecoveryAction_t` (its "Recovery
action flag"): NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET,
RECOVER_IMEX_DOMAIN, BUS_RESET, SYSTEM_REBOOT. Pure and stdlib-only.
"""

from __future__ import annotations

import re
from typing import Literal

Verdict = Literal["gpu_hang", "gpu_lost", "app_fault", "benign"]
HANG: Verdict = "gpu_hang"
LOST: Verdict = "gpu_lost"
BENIGN: Verdict = "benign"

_TO = re.compile(r"\bto\s+0x([0-9a-f]+)\s*(?:\(([^)]*)\))?", re.I)
# An action that resets the GPU or the node ("GPU Reset Required", "PF FLR" as newer drivers
# name 0x1, "Drain and Reset", "Node Reboot Required") means the card cannot serve until it
# is done: lost, not merely hung. "None" means it recovered. "Drain P2P" only stops
# peer-to-peer traffic until the action is queried again, and an unknown name is at least a
# hang: the work in flight is gone.
_NEEDS_RESET = re.compile(r"reset|reboot|\bflr\b", re.I)
_BY_NUMBER: dict[int, Verdict] = {
    0: BENIGN,
    1: LOST,
    2: LOST,
    3: HANG,
    4: LOST,
    5: HANG,
    6: LOST,
    7: LOST,
}


def verdict(detail: str) -> Verdict:
    """The verdict for the text after `154,` of an Xid 154 line: the action it changed to,
    by name where the line gives one, else by number."""
    m = _TO.search(detail)
    if m is None:
        return HANG
    name = (m.group(2) or "").strip()
    if name.lower() == "none":
        return BENIGN
    if _NEEDS_RESET.search(name):
        return LOST
    if name:
        return HANG
    return _BY_NUMBER.get(int(m.group(1), 16), HANG)
