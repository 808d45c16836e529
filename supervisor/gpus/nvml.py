"""NVIDIA cards through NVML (nvidia-ml-py, imported as `pynvml`).

Every NVML call can block for minutes on a hung card; callers run them in worker threads.
pynvml is imported when NVML is first opened (see `pynvml_module`), not with this module.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.gpus.base import (
    UNKNOWN_BUS_ID,
    GpuError,
    GpuInfo,
    GpuLost,
    bus_id_key,
    bytes_to_mb,
    normalize_bus_id,
    reading,
)
from supervisor.gpus.probing import DEFAULT_DEADLINE_S, Pending, Prober
from supervisor.gpus.visibility import visibility_env

log = structlog.get_logger(__name__)

# "Unknown Error" is what many drivers return for a card in that state, and also what a
# single hiccup returns: lost only when it repeats this many times in a row.
UNKNOWN_RETRIES = 3
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


class NvmlUnavailable(GpuError):
    """NVML could not be started; `missing_library` when there is no NVIDIA driver at all."""

    def __init__(self, message: str, *, missing_library: bool) -> None:
        super().__init__(message)
        self.missing_library = missing_library


def pynvml_module() -> Any:
    """pynvml, imported at first use. It is one 330 kB module: importing it costs ~2.5 MiB,
    and where it has no bytecode yet, compiling it leaves several MiB more in the heap; a
    daemon on simulated cards never opens NVML and is spared both."""
    import pynvml

    return pynvml


def lost_codes() -> frozenset[int]:
    """Codes after which the card is unusable until a reset or a reboot: "GPU is lost"
    (fell off the bus, Xid 79), "GPU requires reset" and an interrupt problem."""
    nv = pynvml_module()
    return frozenset(
        {nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED, nv.NVML_ERROR_IRQ_ISSUE}
    )


def as_text(value: str | bytes) -> str:
    """Older pynvml returned bytes where newer returns str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def translate(exc: BaseException, what: str, *, unknown_streak: int = 0) -> GpuError:
    """An NVML error as the daemon's: GpuLost for a card that is gone, else GpuError.

    `unknown_streak`: how many NVML_ERROR_UNKNOWN in a row the card has returned, this one
    included; past UNKNOWN_RETRIES the card counts as lost.
    """
    code = error_code(exc)
    lost = code in lost_codes() or (
        code == pynvml_module().NVML_ERROR_UNKNOWN and unknown_streak >= UNKNOWN_RETRIES
    )
    cls = GpuLost if lost else GpuError
    return cls(f"{what}: {exc}")


@dataclass(frozen=True)
class NvmlCard:
    nvml_index: int
    handle: Any
    pci_bus_id: str
    name: str
    uuid: str
    mig: bool


class NvmlBackend:
    """NVIDIA cards in PCI bus id order, the order CUDA uses under CUDA_DEVICE_ORDER=PCI_BUS_ID.

    Every card NVML counts keeps its place, even one whose handle cannot be had (GPU is
    lost): CUDA still counts it, so dropping it would shift every later card's number.
    """

    def __init__(self, nvml: Any = None, *, probe_deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        """`nvml`: the library, pynvml unless given (tests give a stand-in)."""
        nvml = pynvml_module() if nvml is None else nvml
        self._nvml = nvml
        self._lock = threading.Lock()
        self._cards: dict[int, NvmlCard] = {}  # by NVML index, once identified
        self._order: list[int] | None = None  # our index -> NVML index
        self._unknown: dict[int, int] = {}  # NVML index -> NVML_ERROR_UNKNOWN streak
        self._prober = Prober(probe_deadline_s)
        self._driver_version = ""
        self._closed = False
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError, and NVMLLibraryMismatchError (a plain Exception)
            missing = error_code(e) == pynvml_module().NVML_ERROR_LIBRARY_NOT_FOUND
            raise NvmlUnavailable(f"NVML: {e}", missing_library=missing) from e
        try:
            self._count = int(nvml.nvmlDeviceGetCount())
            self._driver_version = as_text(nvml.nvmlSystemGetDriverVersion())
        except Exception as e:
            self.close()
            raise NvmlUnavailable(f"NVML device count: {e}", missing_library=False) from e

    def card_count(self) -> int:
        return self._count

    def discover(self) -> list[GpuInfo]:
        results = self._prober.each(self._count, self._read)
        with self._lock:
            if self._order is None:  # fixed at the first discovery: indices never move
                self._order = _arrange(self._count, self._cards)
        cards = []
        for i, nvml_index in enumerate(self._order):
            result = results[nvml_index]
            if isinstance(result, GpuInfo):
                cards.append(_with_index(result, i))
                continue
            why = (
                f"start-up probe blocked past {result.deadline_s:g} s"
                if isinstance(result, Pending)
                else str(result)
            )
            log.warning("nvidia_gpu_unreadable", nvml_index=nvml_index, error=why)
            cards.append(self._lost(i, nvml_index))
        return cards

    def query(self, index: int) -> GpuInfo:
        return _with_index(self._read(self._nvml_index(index)), index)

    def event_handles(self) -> tuple[Any, list[Any]]:
        """The NVML module and the handles of the cards opened so far: what an Xid event
        set is made of (nvml_events.xid_events)."""
        with self._lock:
            handles = [c.handle for c in self._cards.values() if c.handle is not None]
        return self._nvml, handles

    def process_vram_mb(self, index: int) -> dict[int, int]:
        card = self._identified(self._nvml_index(index))
        nvml = self._nvml
        used: dict[int, int] = {}
        for listing in (
            nvml.nvmlDeviceGetComputeRunningProcesses,
            nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                processes = listing(card.handle)
            except nvml.NVMLError as e:
                if error_code(e) == pynvml_module().NVML_ERROR_NOT_SUPPORTED:
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
        except Exception as e:
            log.warning("nvml_shutdown_failed", error=str(e))

    def reopen(self) -> None:
        with self._lock:
            if not self._closed:
                return
        try:
            self._nvml.nvmlInit()
        except Exception as e:
            raise GpuError(f"NVML: {e}") from e
        with self._lock:
            self._closed = False
            self._cards.clear()  # handles do not outlive nvmlShutdown
            self._unknown.clear()

    def _read(self, nvml_index: int) -> GpuInfo:
        """A reading in NVML's numbering (the caller sets our index)."""
        self._prober.check(nvml_index, f"NVIDIA GPU {nvml_index}")
        card = self._identified(nvml_index)
        nvml = self._nvml
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(card.handle)
            util = self._utilization(card)
        except nvml.NVMLError as e:
            raise self._failed(e, card) from e
        with self._lock:
            self._unknown.pop(nvml_index, None)
        total, used = bytes_to_mb(int(memory.total)), bytes_to_mb(int(memory.used))
        return self._info(card, total=total, used=used, util=util, lost=False)

    def _failed(self, e: BaseException, card: NvmlCard) -> GpuError:
        with self._lock:
            streak = self._unknown.get(card.nvml_index, 0) + 1
            if error_code(e) != pynvml_module().NVML_ERROR_UNKNOWN:
                streak = 0
            self._unknown[card.nvml_index] = streak
        return translate(e, f"NVIDIA GPU {card.pci_bus_id}", unknown_streak=streak)

    def _utilization(self, card: NvmlCard) -> float | None:
        nvml = self._nvml
        try:
            return float(nvml.nvmlDeviceGetUtilizationRates(card.handle).gpu)
        except nvml.NVMLError as e:
            # MIG-enabled cards and some older boards do not report utilization: unknown,
            # which is not 0 % (a watchdog would call every quiet job on them hung).
            if error_code(e) == pynvml_module().NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def _nvml_index(self, index: int) -> int:
        with self._lock:
            order = self._order
        if order is None:
            self.discover()
            return self._nvml_index(index)
        if not 0 <= index < len(order):
            raise GpuError(f"no NVIDIA GPU {index} (there are {len(order)})")
        return order[index]

    def _identified(self, nvml_index: int) -> NvmlCard:
        """The card's handle and identity; a card that failed before is tried afresh."""
        with self._lock:
            card = self._cards.get(nvml_index)
        if card is not None:
            return card
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
            bus_id = normalize_bus_id(as_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            name = as_text(nvml.nvmlDeviceGetName(handle))
            uuid = as_text(nvml.nvmlDeviceGetUUID(handle))
            mig = _mig_enabled(nvml, handle)
        except nvml.NVMLError as e:
            raise translate(e, f"NVIDIA GPU {nvml_index} (NVML index)") from e
        except ValueError as e:
            raise GpuLost(f"NVIDIA GPU {nvml_index} (NVML index): {e}") from e
        card = NvmlCard(nvml_index, handle, bus_id, name, uuid, mig)
        if mig:
            log.warning(
                "nvidia_gpu_in_mig_mode",
                pci_bus_id=bus_id,
                uuid=uuid,
                detail="MIG instances are not scheduled; the card takes no jobs",
            )
        with self._lock:
            self._cards.setdefault(nvml_index, card)
            return self._cards[nvml_index]

    def _lost(self, index: int, nvml_index: int) -> GpuInfo:
        with self._lock:
            card = self._cards.get(nvml_index)
        if card is None:
            card = NvmlCard(nvml_index, None, UNKNOWN_BUS_ID, f"NVIDIA GPU {nvml_index}", "", False)
        return _with_index(self._info(card, total=0, used=0, util=None, lost=True), index)

    def _info(
        self, card: NvmlCard, *, total: int, used: int, util: float | None, lost: bool
    ) -> GpuInfo:
        return reading(
            card.nvml_index,
            "nvidia",
            card.name,
            card.pci_bus_id,
            self._driver_version,
            total=total,
            used=used,
            util=util,
            lost=lost,
            uuid=card.uuid,
            mig=card.mig,
        )


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except (nvml.NVMLError, AttributeError):
        return False  # not supported (pre-Ampere), or a pynvml without MIG calls
    return int(current) == MIG_ENABLED


def _arrange(count: int, cards: dict[int, NvmlCard]) -> list[int]:
    """Our order of NVML's cards: the identified ones sorted by bus id into the places they
    hold, and every card NVML could not open left at its own NVML index."""
    known = sorted(
        (i for i in range(count) if i in cards), key=lambda i: bus_id_key(cards[i].pci_bus_id)
    )
    slots = iter(known)
    return [next(slots) if i in cards else i for i in range(count)]


def _with_index(info: GpuInfo, index: int) -> GpuInfo:
    # CUDA under PCI_BUS_ID numbers cards like this order, so its number is also ours.
    return dataclasses.replace(info, index=index, vendor_index=index)
