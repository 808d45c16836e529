"""Card identity: indices that hold when a card is lost, UUIDs, MIG, the visibility a job
gets, NVML's transient errors, the allocation gpusvd runs in, and a wedged start."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pynvml
import pytest

from supervisor.core.admission import Candidate, Card, HostMemory, plan
from supervisor.gpus import GpuError, GpuLost
from supervisor.gpus.allocation import AllocatedBackend, allocation_from, granted
from supervisor.gpus.amd import AmdBackend
from supervisor.gpus.base import GpuResetting, dcgm_bus_id
from supervisor.gpus.nvml import UNKNOWN_RETRIES, NvmlBackend, NvmlUnavailable
from supervisor.gpus.simulated import SimulatedBackend, parse_spec
from supervisor.gpus.visibility import identify
from tests.gpus.test_amd import add_amd_card
from tests.gpus.test_nvml import FakeDevice, FakeNvml

UUIDS = [f"GPU-{i}{i}{i}{i}aaaa-0000-4000-8000-00000000000{i}" for i in range(3)]


@pytest.fixture
def three() -> FakeNvml:
    """Three cards; the second cannot be opened at all (GPU is lost at handle-by-index)."""
    return FakeNvml(
        [
            FakeDevice("00000000:01:00.0", "NVIDIA H100", 81559, uuid=UUIDS[0]),
            FakeDevice(
                "00000000:41:00.0",
                "NVIDIA H100",
                81559,
                uuid=UUIDS[1],
                handle_error=pynvml.NVML_ERROR_GPU_IS_LOST,
            ),
            FakeDevice("00000000:81:00.0", "NVIDIA H100", 81559, uuid=UUIDS[2]),
        ]
    )


def test_a_card_lost_at_start_keeps_its_place(three: FakeNvml) -> None:
    cards = NvmlBackend(three).discover()
    assert [c.index for c in cards] == [0, 1, 2]
    assert [c.vendor_index for c in cards] == [0, 1, 2]
    assert [c.health for c in cards] == ["ok", "lost", "ok"]
    assert [c.uuid for c in cards] == [UUIDS[0], "", UUIDS[2]]
    assert [c.pci_bus_id for c in cards] == ["0000:01:00.0", "", "0000:81:00.0"]


def test_jobs_get_the_cards_around_a_lost_one_by_index_and_by_uuid(three: FakeNvml) -> None:
    backend = NvmlBackend(three)
    cards = backend.discover()
    admission = [
        Card(c.index, c.vram_total_mb, c.vram_used_mb, healthy=c.health == "ok", running=())
        for c in cards
    ]
    host = HostMemory(limit_mb=1 << 20, available_mb=1 << 20, reserve_mb=0)
    decided = plan(
        [Candidate(1, gpus=2, vram_mb=None, projection=None, held_since=None)],
        cards=admission,
        cpu_slots_free=1,
        host=host,
        running=(),
        now=0.0,
        max_backfill_wait_s=900,
    )
    picked = decided.starts[0].gpus
    assert picked == (0, 2)
    chosen = [cards[i] for i in picked]
    env = identify(backend.visibility_env(chosen), chosen)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUSV_GPU_UUIDS"] == f"{UUIDS[0]},{UUIDS[2]}"
    by_uuid = identify(backend.visibility_env(chosen), chosen, "uuid")
    assert by_uuid["CUDA_VISIBLE_DEVICES"] == f"{UUIDS[0]},{UUIDS[2]}"


def test_a_lost_card_is_tried_afresh_and_keeps_its_index(three: FakeNvml) -> None:
    backend = NvmlBackend(three)
    backend.discover()
    with pytest.raises(GpuLost):
        backend.query(1)
    three.devices[1].handle_error = None
    card = backend.query(1)
    assert (card.index, card.health, card.uuid) == (1, "ok", UUIDS[1])
    assert card.pci_bus_id == "0000:41:00.0"


def test_one_unknown_error_is_retried_before_the_card_is_lost(three: FakeNvml) -> None:
    backend = NvmlBackend(three)
    backend.discover()
    three.devices[0].error = pynvml.NVML_ERROR_UNKNOWN
    for _ in range(UNKNOWN_RETRIES - 1):
        with pytest.raises(GpuError) as err:
            backend.query(0)
        assert not isinstance(err.value, GpuLost)
    with pytest.raises(GpuLost):
        backend.query(0)
    three.devices[0].error = None
    assert backend.query(0).health == "ok"
    three.devices[0].error = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(GpuError) as err:
        backend.query(0)
    assert not isinstance(err.value, GpuLost)  # a good reading resets the streak


def test_a_mig_card_is_marked(three: FakeNvml) -> None:
    three.devices[2].mig = True
    three.devices[2].util_supported = False
    card = NvmlBackend(three).discover()[2]
    assert card.mig and card.health == "ok" and card.utilization_pct is None


def test_a_library_mismatch_is_unavailable_nvml() -> None:
    class Mismatched(FakeNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLLibraryMismatchError("libnvidia-ml.so.1 is 535, needs >= 550")

    with pytest.raises(NvmlUnavailable, match="535") as err:
        NvmlBackend(Mismatched([]))
    assert not err.value.missing_library


def test_a_card_hanging_at_start_leaves_the_others_served(three: FakeNvml) -> None:
    three.devices[1].handle_error = None
    three.devices[1].hang = threading.Event()
    backend = NvmlBackend(three, probe_deadline_s=0.2)
    cards = backend.discover()
    assert [c.health for c in cards] == ["ok", "lost", "ok"]
    assert backend.query(2).health == "ok"
    with pytest.raises(GpuLost, match="start-up probe"):
        backend.query(1)
    three.devices[1].hang.set()


def test_dcgm_bus_id_has_an_eight_digit_domain() -> None:
    assert dcgm_bus_id("0000:0a:00.0") == "00000000:0A:00.0"
    assert dcgm_bus_id("10000:e1:00.0") == "00010000:E1:00.0"
    assert dcgm_bus_id("") == ""


# --- AMD ---


def test_amd_uuid_is_its_unique_id(tmp_path: Path) -> None:
    dev = add_amd_card(tmp_path, 0, "0000:03:00.0")
    (dev / "unique_id").write_text("b2ee7b25d4a0ba41\n")
    add_amd_card(tmp_path, 1, "0000:83:00.0")
    cards = AmdBackend(tmp_path).discover()
    assert [c.uuid for c in cards] == ["GPU-b2ee7b25d4a0ba41", ""]


def test_amd_eperm_reads_as_resetting_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_amd_card(tmp_path, 0, "0000:03:00.0")
    backend = AmdBackend(tmp_path)
    backend.discover()
    # amdgpu's sysfs answers EPERM to every read while it resets; a file cannot, as root.
    real = Path.read_text

    def refusing(self: Path, *args: object, **kwargs: object) -> str:
        if self.name.startswith("mem_info"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", refusing)
    with pytest.raises(GpuResetting, match="resetting"):
        backend.query(0)


# --- the allocation gpusvd runs in ---


def test_cuda_visible_devices_in_our_environment_restricts_the_cards(tmp_path: Path) -> None:
    sim = SimulatedBackend(parse_spec("3x8G"), tmp_path)
    backend = AllocatedBackend(sim, allocation_from({"CUDA_VISIBLE_DEVICES": "1"}))
    cards = backend.discover()
    assert [(c.index, c.vendor_index, c.pci_bus_id) for c in cards] == [(0, 1, "0000:02:00.0")]
    assert backend.query(0).uuid == "GPU-5eed0000-0000-4000-8000-000000000001"
    assert backend.visibility_env(cards)["CUDA_VISIBLE_DEVICES"] == "1"
    assert backend.card_count() == 1 and backend.host_count == 3


def test_an_allocation_by_uuid_or_prefix(tmp_path: Path) -> None:
    cards = SimulatedBackend(parse_spec("3x8G"), tmp_path).discover()
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5eed0000-0000-4000-8000-000000000002,0"}
    assert granted(cards, allocation_from(env)) == [0, 2]
    assert granted(cards, allocation_from({"CUDA_VISIBLE_DEVICES": ""})) == []
    assert granted(cards, allocation_from({})) == [0, 1, 2]
    # ROCR_VISIBLE_DEVICES does not restrict CUDA cards.
    assert granted(cards, allocation_from({"ROCR_VISIBLE_DEVICES": "0"})) == [0, 1, 2]
    with pytest.raises(GpuError, match="no card '7'"):
        granted(cards, allocation_from({"CUDA_VISIBLE_DEVICES": "7"}))


def test_reopen_after_close_reads_the_same_cards_at_the_same_indices(three: FakeNvml) -> None:
    backend = NvmlBackend(three)
    before = backend.discover()
    backend.close()
    three.devices[1].handle_error = None  # the lost card answers after its reset
    backend.reopen()
    after = backend.discover()
    assert [c.uuid for c in after] == [UUIDS[0], UUIDS[1], UUIDS[2]]
    assert [c.index for c in after] == [c.index for c in before] == [0, 1, 2]
    assert three.shutdowns == 1
