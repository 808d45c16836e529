"""Kernel-log classification against the labelled corpora, plus bus ids, prefixes and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.faults.classifier import (
    Classification,
    Classifier,
    FaultClass,
    classify,
    message_of,
    normalize_bus_id,
)
from supervisor.faults.nvidia import UNKNOWN_XID, XID_CATALOG, classify_xid

DATA = Path(__file__).parent.parent / "data"
CORPORA = ("kernel-log-corpus.tsv", "kernel-log-extra.tsv", "kernel-log-families.tsv")


class Row(NamedTuple):
    vendor: str
    fault_class: str
    pci_bus_id: str
    xid: str
    line: str
    source: str


def _rows(name: str) -> list[Row]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == ["vendor", "class", "pci_bus_id", "xid", "line", "source"]
    return [Row(*line.split("\t")) for line in lines[1:]]


def _fed(name: str) -> list[tuple[Row, Classification]]:
    # In file order, as a log is read: AMD process and detail lines need their header.
    classifier = Classifier()
    return [(row, classifier.feed(row.line)) for row in _rows(name)]


CASES = [
    pytest.param(row, result, id=f"{name.split('-')[-1].removesuffix('.tsv')}:{n + 2}")
    for name in CORPORA
    for n, (row, result) in enumerate(_fed(name))
]


@pytest.mark.parametrize(("row", "result"), CASES)
def test_corpus_row(row: Row, result: Classification) -> None:
    assert result.fault_class.value == row.fault_class, row.line
    assert (result.pci_bus_id or "") == row.pci_bus_id, row.line
    assert ("" if result.xid is None else str(result.xid)) == row.xid, row.line
    assert (result.vendor or "") == row.vendor, row.line
    assert result.line == row.line


def test_corpus_covers_every_class_and_vendor() -> None:
    rows = _rows(CORPORA[0])
    assert len(rows) >= 100
    assert {r.fault_class for r in rows} == {c.value for c in FaultClass}
    assert {r.vendor for r in rows} == {"nvidia", "amd"}


# --- context ---------------------------------------------------------------------------------

TIMEOUT = "amdgpu 0000:c2:00.0: ring gfx_0.0.0 timeout, signaled seq=166926, emitted seq=166928"
FAULT = "amdgpu 0000:c1:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32771)"


def test_process_line_takes_the_class_of_its_header() -> None:
    process = "amdgpu 0000:c2:00.0:  Process llama-server pid 12519 thread llama-server pid 12519"
    after_timeout = classify(process, previous=classify(TIMEOUT))
    assert after_timeout.fault_class is FaultClass.GPU_HANG
    alone = classify(process)
    assert alone.fault_class is FaultClass.APP_FAULT


def test_context_survives_unrelated_lines_but_not_another_card() -> None:
    classifier = Classifier()
    classifier.feed(TIMEOUT)
    classifier.feed("[  175.2] usb 1-1: new high-speed USB device number 3 using xhci_hcd")
    same_card = classifier.feed("amdgpu 0000:c2:00.0:  Process a pid 1 thread a pid 1")
    assert same_card.fault_class is FaultClass.GPU_HANG

    classifier.feed(TIMEOUT)
    other_card = classifier.feed("amdgpu 0000:c3:00.0:  Process a pid 1 thread a pid 1")
    assert other_card.fault_class is FaultClass.APP_FAULT


def test_detail_after_benign_line_keeps_its_own_default() -> None:
    benign = classify("amdgpu 0000:c1:00.0: amdgpu: SMU is resuming...")
    detail = classify(
        "amdgpu 0000:c1:00.0: amdgpu:   in page starting at address 0x7f9510f62000 from client 10",
        previous=benign,
    )
    assert detail.fault_class is FaultClass.APP_FAULT


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (FAULT, FaultClass.APP_FAULT),
        (FAULT.replace("vmid:8", "vmid:0"), FaultClass.GPU_HANG),
        (FAULT.replace("pasid:32771", "pasid:0"), FaultClass.GPU_HANG),
        (
            "amdgpu 0000:01:00.0: VM fault (0x02, vmid 4, pasid 32768) at page 0",
            FaultClass.APP_FAULT,
        ),
        ("amdgpu 0000:01:00.0: VM fault (0x02, vmid 0, pasid 0) at page 0", FaultClass.GPU_HANG),
        ("amdgpu 0000:01:00.0: GPU fault detected: 147 0x0a504802", FaultClass.APP_FAULT),
    ],
)
def test_amd_page_faults_by_vmid_and_pasid(line: str, expected: FaultClass) -> None:
    assert classify(line).fault_class is expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("amdgpu 0000:03:00.0: amdgpu: GPU reset end with ret = -110", FaultClass.GPU_LOST),
        ("amdgpu 0000:03:00.0: amdgpu: GPU reset end with ret = 0", FaultClass.GPU_HANG),
        ("amdgpu 0000:03:00.0: amdgpu: GPU Recovery Failed: -110", FaultClass.GPU_LOST),
        ("amdgpu 0000:03:00.0: [drm] device wedged, needs recovery", FaultClass.GPU_LOST),
        ("amdgpu 0000:03:00.0: [drm] device wedged, but no recovery needed", FaultClass.GPU_HANG),
        ("amdgpu 0000:03:00.0: ring comp_1.0.0 timeout, but soft recovered", FaultClass.GPU_HANG),
        (
            "amdgpu 0000:03:00.0: amdgpu: MES(1) failed to respond to msg=REMOVE_QUEUE",
            FaultClass.GPU_HANG,
        ),
        (
            "amdgpu 0000:03:00.0: amdgpu: 0 uncorrectable hardware errors detected",
            FaultClass.BENIGN,
        ),
        (
            "amdgpu 0000:03:00.0: amdgpu: 2 uncorrectable hardware errors detected",
            FaultClass.GPU_HANG,
        ),
        (
            "[drm:amdgpu_cs_ioctl [amdgpu]] *ERROR* Failed to initialize parser -125!",
            FaultClass.APP_FAULT,
        ),
        (
            "[drm:amdgpu_dm_atomic_commit_tail [amdgpu]] *ERROR* Waiting for fences timed out!",
            FaultClass.BENIGN,
        ),
    ],
)
def test_amd_wordings_beyond_the_corpus(line: str, expected: FaultClass) -> None:
    result = classify(line)
    assert result.vendor == "amd"
    assert result.fault_class is expected


# --- NVIDIA ----------------------------------------------------------------------------------


def test_xid_table_covers_the_catalog_with_mnemonics() -> None:
    assert set(XID_CATALOG) == set(range(1, 173))
    assert all(entry.mnemonic.isupper() for entry in XID_CATALOG.values())
    assert classify_xid(999, "") == UNKNOWN_XID == "app_fault"


@pytest.mark.parametrize(
    ("xid", "detail", "expected"),
    [
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            "gpu_lost",
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "gpu_lost",
        ),
        (154, "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "gpu_hang"),
        (154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "benign"),
        (154, "GPU recovery action changed from 0x0 to 0x7", "gpu_lost"),
        (145, "RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x0 0x0)", "gpu_hang"),
        (145, "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x0 0x0)", "benign"),
        (146, "TLW_CTRL Non-fatal XC0 i0 Link 00", "benign"),
        (
            63,
            "pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
            "benign",
        ),
        (64, "Row Remapper: row remapping failed", "gpu_lost"),
        (38, "", "gpu_hang"),
        (94, "Contained: CE User Channel (0x9). RST: No, D-RST: No", "gpu_hang"),
        (43, "pid=35521, Ch 00000008", "app_fault"),
    ],
)
def test_xid_rules(xid: int, detail: str, expected: str) -> None:
    assert classify_xid(xid, detail) == expected


@pytest.mark.parametrize(
    ("line", "expected", "bus"),
    [
        (
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 31, pid=7, MMU Fault",
            FaultClass.APP_FAULT,
            "0000:01:00.0",
        ),
        ("NVRM: Xid (0003:00): 13, 0004 00000000 00008297", FaultClass.APP_FAULT, "0000:03:00.0"),
        (
            "NVRM: Xid (PCI:0000:01:00): 200, some future error",
            FaultClass.APP_FAULT,
            "0000:01:00.0",
        ),
        ("NVRM: GPU at 0000:06:00.0 has fallen off the bus.", FaultClass.GPU_LOST, "0000:06:00.0"),
        (
            "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d04) installed in this system has",
            FaultClass.GPU_LOST,
            "0000:01:00.0",
        ),
        ("nvidia: probe of 0000:5d:00.0 failed with error -1", FaultClass.GPU_LOST, "0000:5d:00.0"),
        (
            "NVRM: Attempting to remove minor device 0 with non-zero usage count!",
            FaultClass.GPU_LOST,
            None,
        ),
        (
            "NVRM: A GPU crash dump has been created. If possible, please run",
            FaultClass.GPU_HANG,
            None,
        ),
        (
            "nvidia-modeset: ERROR: GPU:0: Idling display engine timed out: 0x0000c67e:0:0:1097",
            FaultClass.BENIGN,
            None,
        ),
    ],
)
def test_nvidia_wordings_beyond_the_corpus(
    line: str, expected: FaultClass, bus: str | None
) -> None:
    result = classify(line)
    assert (result.vendor, result.fault_class, result.pci_bus_id) == ("nvidia", expected, bus)


def test_unrelated_lines_have_no_vendor() -> None:
    for line in (
        "[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)",
        "pcieport 0000:00:01.1: AER: Corrected error received: 0000:01:00.0",
        "i915 0000:00:02.0: [drm] GPU HANG: ecode 9:1:85dffffb, in Xorg [1183]",
        "",
    ):
        assert classify(line) == Classification(line, None, FaultClass.BENIGN, None, None)


# --- prefixes and bus ids --------------------------------------------------------------------

MESSAGE = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[ 1234.567890] ",
        "[Sun Feb 23 16:24:18 2025] ",
        "kernel: ",
        "Feb  2 08:03:20 kernel: ",
        "Feb 15 17:37:45 host kernel: [82659.755933] ",
        "kwi 03 09:01:25 testowy kernel: ",
        "2024-08-18T01:19:31.352108+00:00 minipc kernel: ",
        "2024-01-15T03:00:00,000000+00:00 ",
        "/var/log/syslog:Apr  9 12:59:18 host kernel: [213201.718230] ",
        "kern.log.1:1234:Apr  9 12:59:18 host kernel: ",
        "4,7761,1843308145,c;",
        "<4>",
        "kern  :err   : [ 1234.567890] ",
        "               ",
    ],
)
def test_prefixes_are_stripped(prefix: str) -> None:
    assert message_of(prefix + MESSAGE) == MESSAGE
    result = classify(prefix + MESSAGE)
    assert (result.fault_class, result.pci_bus_id, result.xid) == (
        FaultClass.GPU_LOST,
        "0000:01:00.0",
        79,
    )


def test_kmsg_escapes_are_decoded() -> None:
    assert message_of("4,1,2,c;NVRM: a\\x0aNVRM: b") == "NVRM: a\nNVRM: b"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PCI:0000:01:00", "0000:01:00.0"),
        ("0000:01:00.0", "0000:01:00.0"),
        ("00000000:01:00.0", "0000:01:00.0"),
        ("0001:6C:00", "0001:6c:00.0"),
        ("PCI:0009:01:00", "0009:01:00.0"),
        ("PCI:0000:01:00 GPU-I:05", "0000:01:00.0"),
        ("0003:00", "0000:03:00.0"),
        ("[GPU ID 0x00008800]", "0000:88:00.0"),
        ("GPU ID 0x00010100", "0001:01:00.0"),
        ("0000:3b:00.1", "0000:3b:00.1"),
        ("0000:01:20.0", None),  # device numbers stop at 0x1f
        ("GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d", None),
        ("16:24:18", None),
        ("", None),
    ],
)
def test_normalize_bus_id(text: str, expected: str | None) -> None:
    assert normalize_bus_id(text) == expected


@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    device=st.integers(0, 0x1F),
    function=st.integers(0, 7),
)
def test_normalize_bus_id_round_trips(domain: int, bus: int, device: int, function: int) -> None:
    canonical = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    assert normalize_bus_id(canonical.upper()) == canonical
    assert normalize_bus_id(f"{domain:08x}:{bus:02x}:{device:02x}.{function}") == canonical
    if function == 0:
        assert normalize_bus_id(f"PCI:{domain:04x}:{bus:02x}:{device:02x}") == canonical
        gpu_id = f"[GPU ID 0x{domain << 16 | bus << 8 | device:08x}]"
        assert normalize_bus_id(gpu_id) == canonical


def test_a_mig_instance_is_kept_beside_the_card() -> None:
    line = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 31, pid=7, name=python, MMU Fault"
    result = classify(line)
    assert (result.pci_bus_id, result.xid, result.gpu_instance) == ("0000:01:00.0", 31, 5)
    assert result.to_json()["gpu_instance"] == 5 and result.line == line
    assert classify("NVRM: Xid (PCI:0000:01:00): 31, pid=7").gpu_instance is None


def test_to_json_shape() -> None:
    result = classify("[ 1.0] NVRM: Xid (PCI:0000:cb:00): 109, pid=1, name=x, Ch 00000008")
    assert result.to_json() == {
        "line": "[ 1.0] NVRM: Xid (PCI:0000:cb:00): 109, pid=1, name=x, Ch 00000008",
        "vendor": "nvidia",
        "class": "gpu_hang",
        "pci_bus_id": "0000:cb:00.0",
        "xid": 109,
    }
    assert json.loads(json.dumps(classify("hello").to_json())) == {
        "line": "hello",
        "vendor": None,
        "class": "benign",
        "pci_bus_id": None,
        "xid": None,
    }


# --- classify-kernel-log ---------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.faults.classify_cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_json_matches_the_corpus(tmp_path: Path) -> None:
    rows = _rows(CORPORA[0])
    log = tmp_path / "kern.log"
    log.write_text("".join(row.line + "\n" for row in rows), encoding="utf-8")
    done = _cli(str(log), "--json")
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines()]
    assert [o["line"] for o in objects] == [row.line for row in rows]
    assert [o["class"] for o in objects] == [row.fault_class for row in rows]
    assert [o["pci_bus_id"] or "" for o in objects] == [row.pci_bus_id for row in rows]
    assert [o["xid"] for o in objects] == [int(row.xid) if row.xid else None for row in rows]


def test_cli_plain_reads_stdin() -> None:
    line = "NVRM: Xid (PCI:0000:01:00): 109, pid=1, name=x, Ch 00000008"
    done = _cli(stdin=f"{line}\nhello\n")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.split()[:4] == ["gpu_hang", "nvidia", "0000:01:00.0", "xid=109"]
    assert first.endswith(line)
    assert second.split() == ["benign", "-", "-", "-", "hello"]


def test_cli_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    done = _cli(str(tmp_path / "absent.log"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "absent.log" in done.stderr
