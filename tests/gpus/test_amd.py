"""The AMD backend against a sysfs tree built in tmp_path (a real sysfs cannot exist here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from supervisor.gpus import NO_GPU_WARNING, GpuError, GpuLost, open_backend
from supervisor.gpus.amd import AmdBackend

MIB = 1024 * 1024


def make_pci_device(
    sysfs: Path,
    bus_id: str,
    *,
    vendor: str = "0x1002",
    device: str = "0x740f",
    product_name: str | None = None,
    vram_total_mb: int | None = 65536,
    vram_used_mb: int = 0,
    busy_percent: int | None = 0,
    uevent: bool = True,
) -> Path:
    """A PCI device directory as amdgpu (or another driver) presents it."""
    dev = sysfs / "devices" / "pci0000:00" / bus_id
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(f"{vendor}\n")
    (dev / "device").write_text(f"{device}\n")
    if uevent:
        (dev / "uevent").write_text(f"DRIVER=amdgpu\nPCI_ID=1002:740F\nPCI_SLOT_NAME={bus_id}\n")
    if product_name is not None:
        (dev / "product_name").write_text(f"{product_name}\n")
    if vram_total_mb is not None:
        (dev / "mem_info_vram_total").write_text(f"{vram_total_mb * MIB}\n")
        (dev / "mem_info_vram_used").write_text(f"{vram_used_mb * MIB}\n")
    if busy_percent is not None:
        (dev / "gpu_busy_percent").write_text(f"{busy_percent}\n")
    return dev


def add_drm_entry(sysfs: Path, name: str, device_dir: Path) -> None:
    entry = sysfs / "class" / "drm" / name
    entry.mkdir(parents=True)
    (entry / "device").symlink_to(device_dir)


def add_amd_card(sysfs: Path, card: int, bus_id: str, **kwargs: object) -> Path:
    dev = make_pci_device(sysfs, bus_id, **kwargs)  # type: ignore[arg-type]
    add_drm_entry(sysfs, f"card{card}", dev)
    return dev


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """Two AMD cards whose DRM numbers run against their bus order, plus decoys."""
    root = tmp_path / "sys"
    add_amd_card(root, 0, "0000:83:00.0", product_name="AMD Instinct MI210", vram_used_mb=1024)
    add_amd_card(root, 1, "0000:03:00.0", device="0x744c", vram_total_mb=24560, busy_percent=37)
    # An NVIDIA card driven by nouveau also shows up under /sys/class/drm.
    nvidia = make_pci_device(root, "0000:41:00.0", vendor="0x10de")
    add_drm_entry(root, "card2", nvidia)
    # A pre-GCN card on the radeon driver: vendor 0x1002 but no mem_info files.
    radeon = make_pci_device(root, "0000:c1:00.0", vram_total_mb=None)
    add_drm_entry(root, "card3", radeon)
    # Connector and render entries point at devices too; they are not cards.
    add_drm_entry(root, "card0-DP-1", make_pci_device(root, "0000:e1:00.0"))
    add_drm_entry(root, "renderD128", make_pci_device(root, "0000:e2:00.0"))
    (root / "module" / "amdgpu").mkdir(parents=True)
    (root / "module" / "amdgpu" / "version").write_text("6.8.5\n")
    return root


def test_discover_finds_amd_cards_in_bus_order(sysfs: Path) -> None:
    cards = AmdBackend(sysfs).discover()
    assert [c.pci_bus_id for c in cards] == ["0000:03:00.0", "0000:83:00.0"]
    assert [c.index for c in cards] == [0, 1]
    assert [c.vendor_index for c in cards] == [0, 1]
    assert {c.vendor for c in cards} == {"amd"}
    assert [c.name for c in cards] == ["AMD GPU 0x744c", "AMD Instinct MI210"]
    assert [c.vram_total_mb for c in cards] == [24560, 65536]
    assert [c.vram_used_mb for c in cards] == [0, 1024]
    assert [c.utilization_pct for c in cards] == [37.0, 0.0]
    assert {c.driver_version for c in cards} == {"6.8.5"}
    assert {c.health for c in cards} == {"ok"}


def test_driver_version_falls_back_to_the_kernel_release(sysfs: Path) -> None:
    shutil.rmtree(sysfs / "module")
    card = AmdBackend(sysfs).discover()[0]
    assert card.driver_version == os.uname().release


def test_query_reads_fresh_values(sysfs: Path) -> None:
    backend = AmdBackend(sysfs)
    backend.discover()
    dev = sysfs / "devices" / "pci0000:00" / "0000:03:00.0"
    (dev / "gpu_busy_percent").write_text("91\n")
    (dev / "mem_info_vram_used").write_text(f"{2048 * MIB}\n")
    card = backend.query(0)
    assert (card.utilization_pct, card.vram_used_mb) == (91.0, 2048)


def test_a_card_whose_files_vanish_is_lost(sysfs: Path) -> None:
    backend = AmdBackend(sysfs)
    backend.discover()
    shutil.rmtree(sysfs / "devices" / "pci0000:00" / "0000:83:00.0")
    with pytest.raises(GpuLost, match=r"0000:83:00\.0.*ENOENT"):
        backend.query(1)
    assert backend.query(0).health == "ok"
    assert [c.health for c in backend.discover()] == ["ok", "lost"]


def test_a_card_without_busy_percent_reads_unknown_utilization(tmp_path: Path) -> None:
    add_amd_card(tmp_path, 0, "0000:03:00.0", busy_percent=None)
    assert AmdBackend(tmp_path).query(0).utilization_pct is None


def test_a_garbled_value_is_an_error_but_not_a_lost_card(sysfs: Path) -> None:
    backend = AmdBackend(sysfs)
    (sysfs / "devices" / "pci0000:00" / "0000:03:00.0" / "gpu_busy_percent").write_text("x\n")
    with pytest.raises(GpuError, match="not a number") as err:
        backend.query(0)
    assert not isinstance(err.value, GpuLost)


def test_bus_id_comes_from_the_device_link_without_uevent(tmp_path: Path) -> None:
    add_amd_card(tmp_path, 0, "0000:0A:00.0", uevent=False)
    assert AmdBackend(tmp_path).discover()[0].pci_bus_id == "0000:0a:00.0"


def test_no_drm_directory_means_no_cards(tmp_path: Path) -> None:
    backend = AmdBackend(tmp_path)
    assert backend.card_count() == 0
    assert backend.discover() == []
    with pytest.raises(GpuError, match="no AMD GPU 0"):
        backend.query(0)


def test_process_vram_is_unknown(sysfs: Path) -> None:
    assert AmdBackend(sysfs).process_vram_mb(0) == {}


def test_amd_cards_are_shown_through_rocr_only(sysfs: Path) -> None:
    backend = AmdBackend(sysfs)
    cards = backend.discover()
    assert backend.visibility_env([cards[1]]) == {"ROCR_VISIBLE_DEVICES": "1"}
    assert backend.visibility_env(cards) == {"ROCR_VISIBLE_DEVICES": "0,1"}


def test_a_job_without_cards_on_an_amd_box_sees_none(sysfs: Path) -> None:
    assert AmdBackend(sysfs).visibility_env([]) == {
        "CUDA_VISIBLE_DEVICES": "",
        "ROCR_VISIBLE_DEVICES": "",
    }


def test_open_backend_finds_amd_cards(sysfs: Path, tmp_path: Path) -> None:
    backend, warnings = open_backend(None, tmp_path / "state", sysfs=sysfs)
    try:
        amd = [c for c in backend.discover() if c.vendor == "amd"]
        assert [c.pci_bus_id for c in amd] == ["0000:03:00.0", "0000:83:00.0"]
        assert NO_GPU_WARNING not in warnings
        assert backend.query(amd[1].index).name == "AMD Instinct MI210"
    finally:
        backend.close()


def test_open_backend_without_any_card_warns(tmp_path: Path) -> None:
    backend, warnings = open_backend(None, tmp_path, sysfs=tmp_path / "empty")
    if backend.discover():
        pytest.skip("this machine has NVIDIA cards")
    assert warnings == [NO_GPU_WARNING]
    assert "--simulate-gpus 2x24G" in warnings[0]
    assert backend.visibility_env([]) == {"CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(GpuError):
        backend.query(0)
