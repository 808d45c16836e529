"""What every GPU backend offers: the card record, the errors, and the backend protocol."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Vendor = Literal["nvidia", "amd", "simulated"]
Health = Literal["ok", "lost"]
UNKNOWN_BUS_ID = ""  # a card that failed before it could say where it sits


@dataclass(frozen=True)
class GpuInfo:
    """One card as the daemon sees it, at the moment of the reading."""

    index: int  # daemon-wide card index 0..N-1, ordered by PCI bus id
    vendor: Vendor
    vendor_index: int  # the card's index in its vendor's visibility variable
    name: str
    pci_bus_id: str  # normalized "0000:01:00.0", lower-case
    vram_total_mb: int
    vram_used_mb: int
    utilization_pct: float | None  # None: the card cannot tell (MIG, no busy counter)
    driver_version: str
    health: Health
    uuid: str = ""  # "GPU-…" (NVIDIA, AMD), "" while unknown
    mig: bool = False  # the card is split into MIG instances: gpusv does not place jobs on it


def reading(
    index: int,
    vendor: Vendor,
    name: str,
    pci_bus_id: str,
    driver_version: str,
    *,
    total: int,
    used: int,
    util: float | None,
    lost: bool,
    uuid: str = "",
    mig: bool = False,
) -> GpuInfo:
    """A card's reading with the backend's raw figures clamped to what can be true."""
    return GpuInfo(
        index=index,
        vendor=vendor,
        vendor_index=index,
        name=name,
        pci_bus_id=pci_bus_id,
        vram_total_mb=total,
        vram_used_mb=min(used, total),
        utilization_pct=None if util is None else min(max(util, 0.0), 100.0),
        driver_version=driver_version,
        health="lost" if lost else "ok",
        uuid=uuid,
        mig=mig,
    )


class GpuError(Exception):
    """A GPU could not be read or a backend could not be opened."""


class GpuLost(GpuError):
    """The card fell off the bus or is otherwise unusable right now."""


class GpuResetting(GpuError):
    """The driver refuses to answer while it resets the card: neither ok nor lost."""


class GpuBackend(Protocol):
    def discover(self) -> list[GpuInfo]:
        """Every card, in index order. Blocking: run it in a worker thread."""
        ...

    def query(self, index: int) -> GpuInfo:
        """A fresh reading; raises GpuLost. May block forever on a wedged card."""
        ...

    def process_vram_mb(self, index: int) -> dict[int, int]:
        """pid -> MiB that process holds on the card; {} when the backend cannot tell."""
        ...

    def visibility_env(self, cards: Sequence[GpuInfo]) -> dict[str, str]:
        """The variables to set for a job assigned exactly these cards."""
        ...

    def card_count(self) -> int:
        """How many cards the backend manages, lost ones included."""
        ...

    def close(self) -> None: ...

    def reopen(self) -> None:
        """Take the driver again after close(); the next discover() reads every card."""
        ...


_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-7])$"
)


def normalize_bus_id(raw: str) -> str:
    """One spelling of a PCI address: "00000000:01:00.0" (NVML) or "01:00.0" -> "0000:01:00.0".

    Kernel log lines, sysfs and NVML spell the same address differently; comparing them
    needs one spelling.
    """
    m = _BUS_ID.match(raw.strip().lower())
    if m is None:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    # Intel VMD puts devices in domains past 0xffff, so the domain keeps any width >= 4.
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn']}"


def bus_id_key(bus_id: str) -> tuple[int, int, int, int]:
    """Sort key for normalized bus ids (a string sort breaks on domains wider than 4 digits)."""
    if bus_id == UNKNOWN_BUS_ID:
        return (-1, -1, -1, -1)
    domain, bus, rest = bus_id.split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def dcgm_bus_id(bus_id: str) -> str:
    """The bus id as NVML and dcgm-exporter label it: an 8-digit domain, upper-case hex."""
    try:
        domain, rest = normalize_bus_id(bus_id).split(":", 1)
    except ValueError:
        return bus_id  # "" (unknown) or a spelling we cannot read: as it is
    return f"{int(domain, 16):08X}:{rest.upper()}"


def bytes_to_mb(n: int) -> int:
    """Bytes to whole MiB, rounded down (a card never has a fraction more than it says)."""
    return n // (1024 * 1024)
