"""GPU backends: NVIDIA (NVML), AMD (sysfs) and simulated cards behind one protocol."""

from supervisor.gpus.base import (
    GpuBackend,
    GpuError,
    GpuInfo,
    GpuLost,
    Health,
    Vendor,
    bus_id_key,
    normalize_bus_id,
)
from supervisor.gpus.discovery import NO_GPU_WARNING, open_backend
from supervisor.gpus.simulated import parse_spec, write_control
from supervisor.gpus.visibility import VISIBILITY_VARIABLES, apply_visibility, visibility_env

__all__ = [
    "NO_GPU_WARNING",
    "VISIBILITY_VARIABLES",
    "GpuBackend",
    "GpuError",
    "GpuInfo",
    "GpuLost",
    "Health",
    "Vendor",
    "apply_visibility",
    "bus_id_key",
    "normalize_bus_id",
    "open_backend",
    "parse_spec",
    "visibility_env",
    "write_control",
]
