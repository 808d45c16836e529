"""The NVML backend: its pure parts, its logic over a stand-in for the driver library, and
the real library where one is installed. Also the cross-vendor composite."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from supervisor.gpus import GpuError, GpuLost, bus_id_key, normalize_bus_id
from supervisor.gpus.amd import AmdBackend
from supervisor.gpus.composite import CompositeBackend
from supervisor.gpus.nvml import NvmlBackend, NvmlUnavailable, as_text, translate
from tests.gpus.test_amd import add_amd_card

MIB = 1024 * 1024


def nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


needs_nvml = pytest.mark.skipif(
    not nvml_library_present(), reason="libnvidia-ml.so.1 is not installed (no NVIDIA driver)"
)
without_nvml = pytest.mark.skipif(
    nvml_library_present(), reason="libnvidia-ml.so.1 is installed here"
)


# --- pure parts ---


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:01:00.0", "0000:01:00.0"),
        ("0000:0A:00.0", "0000:0a:00.0"),
        ("01:00.0", "0000:01:00.0"),
        ("00000001:C1:1F.7", "0001:c1:1f.7"),
        ("00010000:E1:00.0", "10000:e1:00.0"),
        (" 0000:03:00.0\n", "0000:03:00.0"),
    ],
)
def test_normalize_bus_id(raw: str, normal: str) -> None:
    assert normalize_bus_id(raw) == normal
    assert normalize_bus_id(normal) == normal


@pytest.mark.parametrize("raw", ["", "0000:01:00", "zz:00.0", "0000:01:00.8", "1:2:3:4.0"])
def test_normalize_bus_id_rejects_what_is_not_a_bus_id(raw: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_bus_id(raw)


def test_bus_ids_sort_numerically_across_domain_widths() -> None:
    ids = ["10000:01:00.0", "ffff:01:00.0", "0000:81:00.0", "0000:0a:00.0"]
    assert sorted(ids, key=bus_id_key) == [
        "0000:0a:00.0",
        "0000:81:00.0",
        "ffff:01:00.0",
        "10000:01:00.0",
    ]


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_IRQ_ISSUE,
    ],
)
def test_errors_of_a_card_that_is_gone_become_gpu_lost(code: int) -> None:
    err = translate(pynvml.NVMLError(code), "NVIDIA GPU 0000:01:00.0")
    assert isinstance(err, GpuLost)
    assert str(err).startswith("NVIDIA GPU 0000:01:00.0: ")


def test_the_lost_error_class_maps_like_its_code() -> None:
    assert isinstance(translate(pynvml.NVMLError_GpuIsLost(), "x"), GpuLost)


@pytest.mark.parametrize(
    "exc",
    [
        pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED),
        pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION),
        pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT),
        RuntimeError("something else"),
    ],
)
def test_other_errors_stay_ordinary(exc: BaseException) -> None:
    err = translate(exc, "x")
    assert isinstance(err, GpuError) and not isinstance(err, GpuLost)


def test_as_text_decodes_what_older_pynvml_returned() -> None:
    assert as_text(b"NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert as_text("550.54.15") == "550.54.15"


# --- the backend over a stand-in driver library ---


@dataclass
class FakeDevice:
    bus_id: str | bytes
    name: str | bytes
    total_mb: int
    used_mb: int = 0
    util: int = 0
    lost: bool = False
    util_supported: bool = True
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    uuid: str = ""
    mig: bool = False
    handle_error: int | None = None  # nvmlDeviceGetHandleByIndex fails with this code
    error: int | None = None  # every reading fails with this code
    hang: Any = None  # a threading.Event: readings block until it is set


class FakeNvml:
    """The slice of pynvml's API the backend uses, over cards that cannot exist here.

    Errors are pynvml's own classes, so the backend's error handling is the real one.
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, devices: list[FakeDevice], *, init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        d = self.devices[i]
        if d.handle_error is not None:
            raise pynvml.NVMLError(d.handle_error)
        return d

    def nvmlDeviceGetUUID(self, d: FakeDevice) -> str:
        return d.uuid or f"GPU-{abs(hash(d.bus_id)):08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetMigMode(self, d: FakeDevice) -> tuple[int, int]:
        return (1, 1) if d.mig else (0, 0)

    def nvmlDeviceGetPciInfo(self, d: FakeDevice) -> Any:
        return SimpleNamespace(busId=d.bus_id)

    def nvmlDeviceGetName(self, d: FakeDevice) -> str | bytes:
        return d.name

    def nvmlDeviceGetMemoryInfo(self, d: FakeDevice) -> Any:
        self._check(d)
        return SimpleNamespace(total=d.total_mb * MIB, used=d.used_mb * MIB)

    def nvmlDeviceGetUtilizationRates(self, d: FakeDevice) -> Any:
        self._check(d)
        if not d.util_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=d.util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, d: FakeDevice) -> list[Any]:
        self._check(d)
        return [SimpleNamespace(pid=p, usedGpuMemory=_bytes(mb)) for p, mb in d.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, d: FakeDevice) -> list[Any]:
        self._check(d)
        return [SimpleNamespace(pid=p, usedGpuMemory=_bytes(mb)) for p, mb in d.graphics]

    def _check(self, d: FakeDevice) -> None:
        if d.hang is not None:
            d.hang.wait()
        if d.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if d.error is not None:
            raise pynvml.NVMLError(d.error)


def _bytes(mb: int | None) -> int | None:
    return None if mb is None else mb * MIB


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(
        [
            FakeDevice("00000000:41:00.0", "NVIDIA RTX A6000", 49140, used_mb=300, util=5),
            FakeDevice(b"00000000:01:00.0", b"NVIDIA GeForce RTX 4090", 24564, util=99),
        ]
    )


def test_cards_are_numbered_by_bus_id_not_nvml_order(fake: FakeNvml) -> None:
    cards = NvmlBackend(fake).discover()
    assert [c.pci_bus_id for c in cards] == ["0000:01:00.0", "0000:41:00.0"]
    assert [(c.index, c.vendor_index) for c in cards] == [(0, 0), (1, 1)]
    assert [c.name for c in cards] == ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"]
    assert [c.vram_total_mb for c in cards] == [24564, 49140]
    assert [c.utilization_pct for c in cards] == [99.0, 5.0]
    assert {c.driver_version for c in cards} == {"550.54.15"}
    assert {c.vendor for c in cards} == {"nvidia"}


def test_a_lost_card_raises_and_is_discovered_as_lost(fake: FakeNvml) -> None:
    backend = NvmlBackend(fake)
    fake.devices[0].lost = True  # 0000:41:00.0, index 1
    with pytest.raises(GpuLost, match=r"0000:41:00\.0"):
        backend.query(1)
    with pytest.raises(GpuLost):
        backend.process_vram_mb(1)
    assert [c.health for c in backend.discover()] == ["ok", "lost"]


def test_unsupported_utilization_reads_unknown_not_zero(fake: FakeNvml) -> None:
    fake.devices[1].util_supported = False
    assert NvmlBackend(fake).query(0).utilization_pct is None


def test_process_vram_merges_compute_and_graphics(fake: FakeNvml) -> None:
    fake.devices[1].compute = [(100, 2000), (200, None)]
    fake.devices[1].graphics = [(100, 2000), (300, 50)]
    assert NvmlBackend(fake).process_vram_mb(0) == {100: 2000, 200: 0, 300: 50}


def test_nvidia_cards_are_shown_through_cuda_variables(fake: FakeNvml) -> None:
    backend = NvmlBackend(fake)
    cards = backend.discover()
    assert backend.visibility_env([cards[1]]) == {
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert backend.visibility_env([]) == {"CUDA_VISIBLE_DEVICES": ""}


def test_close_shuts_nvml_down_once(fake: FakeNvml) -> None:
    backend = NvmlBackend(fake)
    backend.close()
    backend.close()
    assert fake.shutdowns == 1


def test_a_driver_that_does_not_load_is_reported() -> None:
    broken = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable) as err:
        NvmlBackend(broken)
    assert not err.value.missing_library


@without_nvml
def test_a_missing_library_is_told_apart() -> None:
    with pytest.raises(NvmlUnavailable) as err:
        NvmlBackend()
    assert err.value.missing_library


# --- both vendors on one box ---


def test_composite_numbers_both_vendors_by_bus_id(fake: FakeNvml, tmp_path: Path) -> None:
    add_amd_card(tmp_path, 0, "0000:23:00.0", product_name="AMD Radeon PRO W7900")
    add_amd_card(tmp_path, 1, "0000:c3:00.0")
    backend = CompositeBackend([NvmlBackend(fake), AmdBackend(tmp_path)])
    cards = backend.discover()
    assert [(c.index, c.vendor, c.vendor_index, c.pci_bus_id) for c in cards] == [
        (0, "nvidia", 0, "0000:01:00.0"),
        (1, "amd", 0, "0000:23:00.0"),
        (2, "nvidia", 1, "0000:41:00.0"),
        (3, "amd", 1, "0000:c3:00.0"),
    ]
    assert backend.query(1).name == "AMD Radeon PRO W7900"
    assert backend.query(2).index == 2
    fake.devices[0].compute = [(4242, 512)]
    assert backend.process_vram_mb(2) == {4242: 512}
    with pytest.raises(GpuError, match="no GPU 4"):
        backend.query(4)


def test_composite_hides_the_other_vendor(fake: FakeNvml, tmp_path: Path) -> None:
    add_amd_card(tmp_path, 0, "0000:23:00.0")
    backend = CompositeBackend([NvmlBackend(fake), AmdBackend(tmp_path)])
    _nv0, amd0, nv1 = backend.discover()
    assert backend.visibility_env([nv1]) == {
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "ROCR_VISIBLE_DEVICES": "",
    }
    assert backend.visibility_env([amd0]) == {
        "CUDA_VISIBLE_DEVICES": "",
        "ROCR_VISIBLE_DEVICES": "0",
    }
    assert backend.visibility_env([]) == {"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


def test_composite_queries_before_discover(fake: FakeNvml) -> None:
    assert CompositeBackend([NvmlBackend(fake)]).query(1).pci_bus_id == "0000:41:00.0"


def test_composite_closes_every_backend(fake: FakeNvml, tmp_path: Path) -> None:
    CompositeBackend([NvmlBackend(fake), AmdBackend(tmp_path)]).close()
    assert fake.shutdowns == 1


# --- the real library, where a driver is installed ---


@needs_nvml
def test_real_nvml_reads_every_card() -> None:
    backend = NvmlBackend()
    try:
        cards = backend.discover()
        assert len(cards) == backend.card_count() >= 1
        for card in cards:
            assert card.pci_bus_id == normalize_bus_id(card.pci_bus_id)
            assert card.vram_total_mb > 0 and card.name and card.driver_version
            fresh = backend.query(card.index)
            assert fresh.pci_bus_id == card.pci_bus_id and fresh.health == "ok"
            assert all(
                pid > 0 and mb >= 0 for pid, mb in backend.process_vram_mb(card.index).items()
            )
        assert [c.pci_bus_id for c in cards] == sorted(
            (c.pci_bus_id for c in cards), key=bus_id_key
        )
    finally:
        backend.close()
