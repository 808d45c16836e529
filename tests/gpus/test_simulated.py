"""The simulated backend, its control files, spec parsing and the visibility rule."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.gpus import (
    GpuError,
    GpuInfo,
    GpuLost,
    apply_visibility,
    open_backend,
    parse_spec,
    visibility_env,
    write_control,
)
from supervisor.gpus.simulated import (
    DRIVER_VERSION,
    SimulatedBackend,
    SimulatedSpec,
    control_path,
    parse_control,
)

WAIT_S = 10.0  # generous: only ever reached when something is wrong


def open_sim(state_dir: Path, spec: str = "2x24G") -> SimulatedBackend:
    backend, warnings = open_backend(spec, state_dir)
    assert warnings == []
    assert isinstance(backend, SimulatedBackend)
    return backend


# --- spec parsing ---


@pytest.mark.parametrize(
    ("spec", "count", "vram_mb"),
    [
        ("2x24G", 2, 24576),
        ("1x512M", 1, 512),
        ("3X1.5g", 3, 1536),
        ("1x1T", 1, 1024 * 1024),
        ("4x8388608K", 4, 8192),
        (" 8 x 80G ", 8, 81920),
        ("1x1048576", 1, 1),
    ],
)
def test_parse_spec_accepts_sizes_in_powers_of_1024(spec: str, count: int, vram_mb: int) -> None:
    assert parse_spec(spec) == SimulatedSpec(count, vram_mb)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("0x24G", "card count must be 1 to"),
        ("2x", "size after 'x' is missing"),
        ("2xfoo", "'foo' is not a size"),
        ("-1x8G", "'-1' is not a whole number"),
        ("24G", "expected NxSIZE"),
        ("2x24Q", "'24Q' is not a size"),
        ("2x1000", "less than 1 MiB"),
        ("65x1G", "card count must be 1 to 64"),
        ("", "expected NxSIZE"),
    ],
)
def test_parse_spec_rejects_bad_specs_with_a_clear_message(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match="bad GPU simulation spec") as err:
        parse_spec(spec)
    assert says in str(err.value)


def test_open_backend_rejects_a_bad_spec(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2xfoo"):
        open_backend("2xfoo", tmp_path)
    assert not (tmp_path / "simulated-gpus").exists()


@given(st.integers(1, 64), st.integers(1, 10**7), st.sampled_from(["M", "m"]))
def test_parse_spec_round_trips_mebibytes(count: int, mb: int, unit: str) -> None:
    assert parse_spec(f"{count}x{mb}{unit}") == SimulatedSpec(count, mb)


# --- discovery ---


def test_discover_numbers_cards_with_hex_bus_ids(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, "17x24G")
    cards = backend.discover()
    assert [c.index for c in cards] == list(range(17))
    assert [c.vendor_index for c in cards] == list(range(17))
    assert cards[0].pci_bus_id == "0000:01:00.0"
    assert cards[9].pci_bus_id == "0000:0a:00.0"
    assert cards[16].pci_bus_id == "0000:11:00.0"
    assert {c.name for c in cards} == {"Simulated GPU"}
    assert {c.vendor for c in cards} == {"simulated"}
    assert {c.vram_total_mb for c in cards} == {24576}
    assert {c.driver_version for c in cards} == {DRIVER_VERSION}
    assert {c.health for c in cards} == {"ok"}


def test_open_creates_a_control_file_per_card(tmp_path: Path) -> None:
    open_sim(tmp_path, "2x8G")
    files = sorted(p.name for p in (tmp_path / "simulated-gpus").iterdir())
    assert files == ["0.json", "1.json"]
    data = json.loads((tmp_path / "simulated-gpus" / "0.json").read_text())
    assert data == {
        "utilization_pct": 0.0,
        "vram_used_mb": 0.0,
        "lost": False,
        "wedged": False,
        "processes": {},
    }


# --- the control file ---


def test_control_change_is_seen_by_the_next_query(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    assert backend.query(1).utilization_pct == 0.0
    write_control(tmp_path, 1, utilization_pct=87.5, vram_used_mb=1000)
    card = backend.query(1)
    assert (card.utilization_pct, card.vram_used_mb) == (87.5, 1000)
    other = backend.query(0)
    assert (other.utilization_pct, other.vram_used_mb) == (0.0, 0)


def test_readings_are_clamped_to_what_a_card_can_report(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, "1x1G")
    write_control(tmp_path, 0, utilization_pct=250, vram_used_mb=5000)
    card = backend.query(0)
    assert (card.utilization_pct, card.vram_used_mb) == (100.0, 1024)


def test_write_control_changes_only_the_given_keys(tmp_path: Path) -> None:
    open_sim(tmp_path)
    write_control(tmp_path, 0, utilization_pct=30)
    write_control(tmp_path, 0, lost=True)
    control = parse_control(control_path(tmp_path, 0).read_bytes())
    assert (control.utilization_pct, control.lost) == (30, True)


def test_write_control_refuses_unknown_keys_and_wrong_types(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown control keys"):
        write_control(tmp_path, 0, wedge=True)
    with pytest.raises(ValueError, match="lost must be true or false"):
        write_control(tmp_path, 0, lost="yes")
    with pytest.raises(ValueError, match="utilization_pct must be a number"):
        write_control(tmp_path, 0, utilization_pct=True)


def test_lost_card_raises_gpu_lost_until_cleared(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    write_control(tmp_path, 0, lost=True)
    with pytest.raises(GpuLost, match=r"0000:01:00\.0"):
        backend.query(0)
    assert backend.query(1).health == "ok"
    discovered = backend.discover()
    assert [c.health for c in discovered] == ["lost", "ok"]
    write_control(tmp_path, 0, lost=False)
    assert backend.query(0).health == "ok"


def test_wedged_card_blocks_query_until_cleared(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    write_control(tmp_path, 1, wedged=True, utilization_pct=12)
    result: list[GpuInfo] = []
    thread = threading.Thread(target=lambda: result.append(backend.query(1)), daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive() and result == []
    write_control(tmp_path, 1, wedged=False)
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert result[0].utilization_pct == 12


def test_a_card_wedged_at_start_starts_lost_and_comes_back(tmp_path: Path) -> None:
    write_control(tmp_path, 1, wedged=True)
    backend = SimulatedBackend(parse_spec("3x8G"), tmp_path, probe_deadline_s=0.2)
    cards = backend.discover()  # returns: one wedged card does not hold up the others
    assert [c.health for c in cards] == ["ok", "lost", "ok"]
    assert cards[1].uuid == "GPU-5eed0000-0000-4000-8000-000000000001"
    with pytest.raises(GpuLost, match="start-up probe"):
        backend.query(1)  # at once: no second thread waits on the same wedge
    assert backend.discover()[1].health == "lost"
    write_control(tmp_path, 1, wedged=False)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            assert backend.query(1).health == "ok"
            break
        except GpuLost:
            time.sleep(0.02)
    else:
        raise AssertionError("the card did not come back once its probe returned")
    backend.close()


def test_unknown_utilization_is_none(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    write_control(tmp_path, 0, utilization_pct=None)
    assert backend.query(0).utilization_pct is None
    assert backend.query(1).utilization_pct == 0.0


def test_close_releases_a_query_blocked_on_a_wedged_card(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    write_control(tmp_path, 0, wedged=True)
    errors: list[BaseException] = []

    def query() -> None:
        try:
            backend.query(0)
        except GpuError as e:
            errors.append(e)

    thread = threading.Thread(target=query, daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()
    backend.close()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert "closed" in str(errors[0])


@pytest.mark.parametrize(
    "garbage",
    [
        '{"utilization_pct": 9',
        "",
        "[]",
        '{"utilization_pct": "high"}',
        '{"lost": 1}',
        '{"utilization_pct": NaN}',
    ],
)
def test_invalid_control_file_keeps_last_good_values(tmp_path: Path, garbage: str) -> None:
    backend = open_sim(tmp_path)
    write_control(tmp_path, 0, utilization_pct=40)
    assert backend.query(0).utilization_pct == 40
    control_path(tmp_path, 0).write_text(garbage)  # written in place, as a careless tool would
    assert backend.query(0).utilization_pct == 40
    write_control(tmp_path, 0, utilization_pct=41)
    assert backend.query(0).utilization_pct == 41


def test_missing_control_file_keeps_last_good_values(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    write_control(tmp_path, 0, vram_used_mb=700)
    backend.query(0)
    control_path(tmp_path, 0).unlink()
    assert backend.query(0).vram_used_mb == 700


def test_restart_keeps_the_control_files(tmp_path: Path) -> None:
    first = open_sim(tmp_path)
    write_control(tmp_path, 0, lost=True)
    write_control(tmp_path, 1, utilization_pct=55)
    first.close()
    second = open_sim(tmp_path)
    with pytest.raises(GpuLost):
        second.query(0)
    assert second.query(1).utilization_pct == 55


def test_unknown_index_is_an_error(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    with pytest.raises(GpuError, match="no simulated GPU 2"):
        backend.query(2)
    with pytest.raises(GpuError):
        backend.process_vram_mb(-1)
    assert backend.process_vram_mb(0) == {}


# --- visibility ---


def test_simulated_cards_are_shown_through_cuda_variables(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, "4x8G")
    cards = backend.discover()
    env = backend.visibility_env([cards[3], cards[1]])
    assert env == {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_job_without_cards_sees_none(tmp_path: Path) -> None:
    backend = open_sim(tmp_path)
    assert backend.visibility_env([]) == {"CUDA_VISIBLE_DEVICES": ""}
    assert visibility_env([], set()) == {"CUDA_VISIBLE_DEVICES": ""}


def test_the_same_card_twice_is_refused(tmp_path: Path) -> None:
    card = open_sim(tmp_path).discover()[0]
    with pytest.raises(ValueError, match="assigned twice"):
        visibility_env([card, card], {"simulated"})


def test_apply_visibility_drops_what_the_submitter_had() -> None:
    submitter = {
        "HOME": "/home/ada",
        "CUDA_VISIBLE_DEVICES": "3",
        "HIP_VISIBLE_DEVICES": "1",
        "ROCR_VISIBLE_DEVICES": "2",
        "GPU_DEVICE_ORDINAL": "0",
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
    }
    env = apply_visibility(submitter, {"ROCR_VISIBLE_DEVICES": "0"})
    assert env == {"HOME": "/home/ada", "ROCR_VISIBLE_DEVICES": "0"}


def test_per_process_vram_adds_to_the_cards_use(tmp_path: Path) -> None:
    backend = open_sim(tmp_path, "1x24G")
    write_control(tmp_path, 0, vram_used_mb=1024, processes={"4242": 6144, "77": 512})
    assert backend.process_vram_mb(0) == {4242: 6144, 77: 512}
    assert backend.query(0).vram_used_mb == 1024 + 6144 + 512


@pytest.mark.parametrize("bad", [[1], {"x": 1}, {"1": -5}, {"1": "big"}, {"1": True}])
def test_bad_process_lists_are_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="processes"):
        write_control(tmp_path, 0, processes=bad)
