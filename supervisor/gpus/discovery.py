"""Choosing the backend at start: simulated cards, the box's real cards, or none."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from supervisor.gpus.allocation import AllocatedBackend, allocation_from
from supervisor.gpus.amd import AmdBackend
from supervisor.gpus.base import GpuBackend
from supervisor.gpus.composite import CompositeBackend
from supervisor.gpus.nvml import NvmlBackend, NvmlUnavailable
from supervisor.gpus.probing import DEFAULT_DEADLINE_S
from supervisor.gpus.simulated import SimulatedBackend, parse_spec

NO_GPU_WARNING = "no GPU found: running CPU-only jobs; simulate cards with --simulate-gpus 2x24G"


def open_backend(
    simulate: str | None,
    state_dir: Path,
    *,
    sysfs: Path = Path("/sys"),
    probe_deadline_s: float = DEFAULT_DEADLINE_S,
    env: Mapping[str, str] | None = None,
) -> tuple[GpuBackend, list[str]]:
    """The backend, and warnings to log loudly.

    `simulate` is an "NxSIZE" spec (ValueError when malformed); None or "" means the real
    cards: NVIDIA through NVML and AMD through sysfs, numbered together by PCI bus id.
    `env` is gpusvd's own environment: a visibility variable there restricts the cards.
    """
    backend, warnings = _open(simulate, state_dir, sysfs, probe_deadline_s)
    allocations = allocation_from(env if env is not None else {})
    if allocations:
        backend = AllocatedBackend(backend, allocations)
    return backend, warnings


def _open(
    simulate: str | None, state_dir: Path, sysfs: Path, deadline_s: float
) -> tuple[GpuBackend, list[str]]:
    if simulate is not None and simulate.strip():
        spec = parse_spec(simulate)
        return SimulatedBackend(spec, state_dir, probe_deadline_s=deadline_s), []
    warnings: list[str] = []
    backends: list[GpuBackend] = []
    try:
        nvml = NvmlBackend(probe_deadline_s=deadline_s)
    except NvmlUnavailable as e:
        # No library is the normal state of a box without NVIDIA cards; anything else is
        # an installed driver that does not work, which an operator must hear about.
        if not e.missing_library:
            warnings.append(f"NVIDIA driver installed but NVML is unusable: {e}")
    else:
        if nvml.card_count() > 0:
            backends.append(nvml)
        else:
            nvml.close()
    amd = AmdBackend(sysfs, probe_deadline_s=deadline_s)
    if amd.card_count() > 0:
        backends.append(amd)
    if not backends:
        warnings.append(NO_GPU_WARNING)
    return CompositeBackend(backends), warnings
