"""NVIDIA cards through NVML (nvidia-ml-py, imported as `pynvml`).

Every NVML call can block for minutes on a hung card; callers run them in worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pynvml
import structlog

from supervisor.gpus.base import (
    GpuError,
    GpuInfo,
    GpuLost,
    bus_id_key,
    bytes_to_mb,
    normalize_bus_id,
    reading,
)
from supervisor.gpus.visibility import visibility_env

log = structlog.get_logger(__name__)

# Codes after which the card is unusable until a reset or a reboot: "GPU is lost" (fell off
# the bus, Xid 79), "GPU requires reset", an interrupt problem, and the "Unknown Error"
# that NVML returns for a card in that state on many drivers.
LOST_CODES: frozenset[int] = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_IRQ_ISSUE,
        pynvml.NVML_ERROR_UNKNOWN,
    }
)


class NvmlUnavailable(GpuError):
    """NVML could not be started; `missing_library` when there is no NVIDIA driver at all."""

    def __init__(self, message: str, *, missing_library: bool) -> None:
        super().__init__(message)
        self.missing_library = missing_library


def as_text(value: str | bytes) -> str:
    """Older pynvml returned bytes where newer returns str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def translate(exc: BaseException, what: str) -> GpuError:
    """An NVML error as the daemon's: GpuLost for a card that is gone, else GpuError."""
    cls = GpuLost if error_code(exc) in LOST_CODES else GpuError
    return cls(f"{what}: {exc}")


@dataclass(frozen=True)
class NvmlCard:
    handle: Any
    pci_bus_id: str
    name: str


class NvmlBackend:
    """NVIDIA cards in PCI bus id order, the order CUDA uses under CUDA_DEVICE_ORDER=PCI_BUS_ID."""

    def __init__(self, nvml: Any = pynvml) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._cards: list[NvmlCard] | None = None
        self._driver_version = ""
        self._closed = False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            missing = error_code(e) == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
            raise NvmlUnavailable(f"NVML: {e}", missing_library=missing) from e
        try:
            self._count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as e:
            self.close()
            raise NvmlUnavailable(f"NVML device count: {e}", missing_library=False) from e

    def card_count(self) -> int:
        return self._count

    def discover(self) -> list[GpuInfo]:
        cards = []
        for i, card in enumerate(self._identified()):
            try:
                cards.append(self.query(i))
            except GpuError as e:
                log.warning("nvidia_gpu_unreadable", pci_bus_id=card.pci_bus_id, error=str(e))
                cards.append(self._info(i, card, total=0, used=0, util=0.0, lost=True))
        return cards

    def query(self, index: int) -> GpuInfo:
        card = self._card(index)
        nvml = self._nvml
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(card.handle)
            util = self._utilization(card)
        except nvml.NVMLError as e:
            raise translate(e, f"NVIDIA GPU {card.pci_bus_id}") from e
        total, used = bytes_to_mb(int(memory.total)), bytes_to_mb(int(memory.used))
        return self._info(index, card, total=total, used=used, util=util, lost=False)

    def process_vram_mb(self, index: int) -> dict[int, int]:
        card = self._card(index)
        nvml = self._nvml
        used: dict[int, int] = {}
        for listing in (
            nvml.nvmlDeviceGetComputeRunningProcesses,
            nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                processes = listing(card.handle)
            except nvml.NVMLError as e:
                if error_code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    continue
                raise translate(e, f"NVIDIA GPU {card.pci_bus_id} processes") from e
            for p in processes:
                # A process with both a compute and a graphics context is listed twice with
                # the same total; None is "not available" (vGPU, some containers).
                mb = 0 if p.usedGpuMemory is None else bytes_to_mb(int(p.usedGpuMemory))
                used[int(p.pid)] = max(mb, used.get(int(p.pid), 0))
        return used

    def visibility_env(self, cards: Sequence[GpuInfo]) -> dict[str, str]:
        return visibility_env(cards, {"nvidia"})

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as e:
            log.warning("nvml_shutdown_failed", error=str(e))

    def _utilization(self, card: NvmlCard) -> float:
        nvml = self._nvml
        try:
            return float(nvml.nvmlDeviceGetUtilizationRates(card.handle).gpu)
        except nvml.NVMLError as e:
            # MIG-enabled cards and some older boards do not report utilization.
            if error_code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return 0.0
            raise

    def _card(self, index: int) -> NvmlCard:
        cards = self._identified()
        if not 0 <= index < len(cards):
            raise GpuError(f"no NVIDIA GPU {index} (there are {len(cards)})")
        return cards[index]

    def _identified(self) -> list[NvmlCard]:
        with self._lock:
            if self._cards is None:
                self._cards = self._identify()
            return self._cards

    def _identify(self) -> list[NvmlCard]:
        nvml = self._nvml
        try:
            self._driver_version = as_text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as e:
            log.warning("nvidia_driver_version_unreadable", error=str(e))
        cards = []
        for i in range(self._count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                bus_id = normalize_bus_id(as_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
                name = as_text(nvml.nvmlDeviceGetName(handle))
            except (nvml.NVMLError, ValueError) as e:
                # Without a bus id the card cannot be placed or matched to kernel log lines.
                log.warning("nvidia_gpu_skipped", nvml_index=i, error=str(e))
                continue
            cards.append(NvmlCard(handle=handle, pci_bus_id=bus_id, name=name))
        return sorted(cards, key=lambda c: bus_id_key(c.pci_bus_id))

    def _info(
        self, index: int, card: NvmlCard, *, total: int, used: int, util: float, lost: bool
    ) -> GpuInfo:
        return reading(
            index,
            "nvidia",
            card.name,
            card.pci_bus_id,
            self._driver_version,
            total=total,
            used=used,
            util=util,
            lost=lost,
        )
