"""AMD cards through the amdgpu driver's sysfs files (no ROCm library needed).

A card is `/sys/class/drm/cardN/device` with vendor 0x1002 and amdgpu's `mem_info_*`
files; connector entries (`card0-DP-1`) and render nodes are not cards. Reads go through
the driver and can block on a sick card, so callers run them in a worker thread.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from supervisor.gpus.base import (
    GpuError,
    GpuInfo,
    GpuLost,
    GpuResetting,
    bus_id_key,
    bytes_to_mb,
    normalize_bus_id,
    reading,
)
from supervisor.gpus.probing import DEFAULT_DEADLINE_S, Pending, Prober
from supervisor.gpus.visibility import visibility_env

AMD_VENDOR_ID = 0x1002
_CARD_ENTRY = re.compile(r"^card\d+$")

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class AmdCard:
    """What does not change while the card is present."""

    device_dir: Path
    pci_bus_id: str
    name: str
    has_busy_percent: bool
    uuid: str  # "GPU-" + amdgpu's unique_id, the form ROCR_VISIBLE_DEVICES takes; "" if none


class AmdBackend:
    """Cards numbered by PCI bus id, which is also their ROCR_VISIBLE_DEVICES order."""

    def __init__(
        self, sysfs: Path = Path("/sys"), *, probe_deadline_s: float = DEFAULT_DEADLINE_S
    ) -> None:
        self._sysfs = Path(sysfs)
        self._prober = Prober(probe_deadline_s)
        self._lock = threading.Lock()
        self._cards: list[AmdCard] | None = None
        self._driver_version = ""

    def card_count(self) -> int:
        return len(self._scanned())

    def discover(self) -> list[GpuInfo]:
        scanned = self._scanned()
        cards = []
        for i, result in enumerate(self._prober.each(len(scanned), self.query)):
            if isinstance(result, GpuInfo):
                cards.append(result)
                continue
            why = f"blocked past {result.deadline_s:g} s" if isinstance(result, Pending) else result
            log.warning("amd_gpu_unreadable", pci_bus_id=scanned[i].pci_bus_id, error=str(why))
            cards.append(self._info(i, scanned[i], total=0, used=0, busy=None, lost=True))
        return cards

    def query(self, index: int) -> GpuInfo:
        card = self._card(index)
        self._prober.check(index, f"AMD GPU {card.pci_bus_id}")
        dev = card.device_dir
        total = bytes_to_mb(_read_int(dev / "mem_info_vram_total", card))
        used = bytes_to_mb(_read_int(dev / "mem_info_vram_used", card))
        # Without gpu_busy_percent the load is unknown, which is not the same as idle.
        busy = float(_read_int(dev / "gpu_busy_percent", card)) if card.has_busy_percent else None
        return self._info(index, card, total=total, used=used, busy=busy, lost=False)

    def process_vram_mb(self, index: int) -> dict[int, int]:
        self._card(index)
        return {}

    def visibility_env(self, cards: Sequence[GpuInfo]) -> dict[str, str]:
        return visibility_env(cards, {"amd"})

    def close(self) -> None:
        pass  # sysfs reads hold nothing open

    def reopen(self) -> None:
        pass

    def _card(self, index: int) -> AmdCard:
        cards = self._scanned()
        if not 0 <= index < len(cards):
            raise GpuError(f"no AMD GPU {index} (there are {len(cards)})")
        return cards[index]

    def _scanned(self) -> list[AmdCard]:
        with self._lock:
            if self._cards is None:
                self._cards = scan_cards(self._sysfs)
                self._driver_version = driver_version(self._sysfs)
            return self._cards

    def _info(
        self, index: int, card: AmdCard, *, total: int, used: int, busy: float | None, lost: bool
    ) -> GpuInfo:
        return reading(
            index,
            "amd",
            card.name,
            card.pci_bus_id,
            self._driver_version,
            total=total,
            used=used,
            util=busy,
            lost=lost,
            uuid=card.uuid,
        )


def scan_cards(sysfs: Path) -> list[AmdCard]:
    """The amdgpu cards under `sysfs`, in PCI bus id order, each once."""
    drm = sysfs / "class" / "drm"
    try:
        entries = sorted(e for e in drm.iterdir() if _CARD_ENTRY.match(e.name))
    except OSError:
        return []  # no DRM at all: a headless box without GPU drivers
    found: dict[str, AmdCard] = {}
    for entry in entries:
        card = _read_card(entry / "device")
        if card is not None:
            found.setdefault(card.pci_bus_id, card)
    return sorted(found.values(), key=lambda c: bus_id_key(c.pci_bus_id))


def _read_card(dev: Path) -> AmdCard | None:
    try:
        if int(_text(dev / "vendor"), 16) != AMD_VENDOR_ID:
            return None
        # The radeon driver (pre-GCN cards) has no mem_info files and no ROCm support.
        if not (dev / "mem_info_vram_total").exists():
            return None
        bus_id = _bus_id(dev)
    except (OSError, ValueError) as e:
        log.warning("amd_gpu_skipped", device=str(dev), error=str(e))
        return None
    return AmdCard(
        device_dir=dev,
        pci_bus_id=bus_id,
        name=_name(dev),
        has_busy_percent=(dev / "gpu_busy_percent").exists(),
        uuid=_uuid(dev),
    )


def _uuid(dev: Path) -> str:
    """amdgpu's unique_id (a 16-digit hex serial, on Vega and later) as ROCm spells it."""
    try:
        unique = _text(dev / "unique_id")
    except OSError:
        return ""
    unique = unique.lower().removeprefix("0x")
    return f"GPU-{unique}" if unique and set(unique) <= set("0123456789abcdef") else ""


def _bus_id(dev: Path) -> str:
    try:
        uevent = _text(dev / "uevent")
    except OSError:
        uevent = ""
    for line in uevent.splitlines():
        key, _, value = line.partition("=")
        if key == "PCI_SLOT_NAME":
            return normalize_bus_id(value)
    # The device link's target is named after the slot: .../0000:03:00.0
    return normalize_bus_id(dev.resolve().name)


def _name(dev: Path) -> str:
    try:
        name = _text(dev / "product_name")  # absent or empty on many consumer cards
    except OSError:
        name = ""
    if name:
        return name
    try:
        return f"AMD GPU {_text(dev / 'device')}"
    except OSError:
        return "AMD GPU"


def driver_version(sysfs: Path) -> str:
    """amdgpu's own version (DKMS builds) or else the kernel's, which carries the in-tree driver."""
    try:
        version = _text(sysfs / "module" / "amdgpu" / "version")
    except OSError:
        version = ""
    return version or os.uname().release


def _text(path: Path) -> str:
    return path.read_text().strip()


def _read_int(path: Path, card: AmdCard) -> int:
    try:
        text = _text(path)
    except OSError as e:
        reason = errno.errorcode.get(e.errno or 0, str(e))
        what = f"AMD GPU {card.pci_bus_id}: {path.name}: {reason}"
        # amdgpu answers EPERM (and EBUSY) to every sysfs read while it resets the card;
        # the card comes back by itself. ENODEV/ENOENT/EIO: the device went away.
        if e.errno in (errno.EPERM, errno.EBUSY):
            raise GpuResetting(f"{what} (the driver is resetting the card)") from e
        raise GpuLost(what) from e
    try:
        return int(text)
    except ValueError as e:
        raise GpuError(f"AMD GPU {card.pci_bus_id}: {path.name}: not a number: {text!r}") from e
