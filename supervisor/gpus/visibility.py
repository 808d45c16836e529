"""Which GPU a job may see: the vendors' visibility variables, as one pure rule.

- NVIDIA (and simulated) cards: `CUDA_VISIBLE_DEVICES` with `CUDA_DEVICE_ORDER=PCI_BUS_ID`,
  because CUDA's default order ("fastest first") differs from NVML's and the daemon's.
- AMD cards: `ROCR_VISIBLE_DEVICES`, which the ROCm runtime applies below HIP and OpenCL.
  `HIP_VISIBLE_DEVICES` (and `CUDA_VISIBLE_DEVICES`, which HIP also honours) index into
  the list ROCr already filtered, so they are removed, never set to the same numbers.
- No cards: `CUDA_VISIBLE_DEVICES=""` (CUDA then sees none) and, on a box with AMD cards,
  `ROCR_VISIBLE_DEVICES=""` (ROCr treats a set but empty variable as "no GPU").
- A box with both vendors: a job's cards are all of one vendor in practice; the other
  vendor's variable is set empty. HIP treats an empty `CUDA_VISIBLE_DEVICES` as unset, so
  hiding NVIDIA cards from an AMD job does not hide its AMD cards from HIP.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal

from supervisor.gpus.base import GpuInfo, Vendor

VisibleBy = Literal["index", "uuid"]
UUIDS_VARIABLE = "GPUSV_GPU_UUIDS"

CUDA_FAMILY: frozenset[Vendor] = frozenset({"nvidia", "simulated"})

# Every variable a job's GPU view depends on. The submitter's own values are dropped, so
# a stale CUDA_VISIBLE_DEVICES in someone's shell cannot point a job at another's card.
VISIBILITY_VARIABLES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
    }
)


def visibility_env(cards: Sequence[GpuInfo], box_vendors: Collection[Vendor]) -> dict[str, str]:
    """The variables for a job assigned `cards` on a box whose cards are of `box_vendors`."""
    _check_distinct(cards)
    cuda = sorted(c.vendor_index for c in cards if c.vendor in CUDA_FAMILY)
    rocr = sorted(c.vendor_index for c in cards if c.vendor == "amd")
    box_has_cuda = bool(cuda) or any(v in CUDA_FAMILY for v in box_vendors)
    box_has_amd = bool(rocr) or "amd" in box_vendors
    env: dict[str, str] = {}
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = _join(cuda)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    elif not rocr or box_has_cuda:
        # A CPU-only job, or an AMD job next to NVIDIA cards: no CUDA card at all.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if box_has_amd:
        env["ROCR_VISIBLE_DEVICES"] = _join(rocr)
    return env


def identify(
    env: Mapping[str, str], cards: Sequence[GpuInfo], by: VisibleBy = "index"
) -> dict[str, str]:
    """`env` (from visibility_env) with the cards' UUIDs added and, with `by="uuid"`, used
    in place of the indices: a UUID names one card whatever CUDA or ROCr can enumerate.
    A card whose UUID is unknown keeps the whole list in indices (the two cannot mix)."""
    out = dict(env)
    uuids = [c.uuid for c in sorted(cards, key=lambda c: c.vendor_index)]
    out[UUIDS_VARIABLE] = ",".join(u for u in uuids if u)
    if by == "uuid" and cards and all(uuids):
        cuda = [
            c.uuid for c in sorted(cards, key=lambda c: c.vendor_index) if c.vendor in CUDA_FAMILY
        ]
        rocr = [c.uuid for c in sorted(cards, key=lambda c: c.vendor_index) if c.vendor == "amd"]
        if cuda:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(cuda)
        if rocr:
            out["ROCR_VISIBLE_DEVICES"] = ",".join(rocr)
    return out


def apply_visibility(env: Mapping[str, str], visibility: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: `env` without any inherited visibility variable, plus `visibility`."""
    out = {k: v for k, v in env.items() if k not in VISIBILITY_VARIABLES}
    out.update(visibility)
    return out


def _join(indices: Sequence[int]) -> str:
    return ",".join(str(i) for i in indices)


def _check_distinct(cards: Sequence[GpuInfo]) -> None:
    seen: set[tuple[str, int]] = set()
    for c in cards:
        key = ("cuda" if c.vendor in CUDA_FAMILY else c.vendor, c.vendor_index)
        if key in seen:
            raise ValueError(f"card {c.vendor} {c.vendor_index} assigned twice")
        seen.add(key)
