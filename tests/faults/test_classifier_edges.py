"""The classifier's edges by table: prefixes, escapes, bus-id forms and vendors, each value
written out; and the whole corpus classified inside a test (the per-row cases of
test_classifier.py are classified while the tests are collected)."""

from __future__ import annotations

import pytest

from supervisor.faults.classifier import (
    Classifier,
    FaultClass,
    classify,
    message_of,
    normalize_bus_id,
)
from tests.faults.test_classifier import CORPORA, _rows


def test_the_whole_corpus_in_file_order() -> None:
    wrong = []
    for name in CORPORA:
        classifier = Classifier()
        for row in _rows(name):
            got = classifier.feed(row.line)
            seen = (got.vendor or "", got.fault_class.value, got.pci_bus_id or "")
            if (
                seen != (row.vendor, row.fault_class, row.pci_bus_id)
                or (str(got.xid) if got.xid is not None else "") != row.xid
            ):
                wrong.append((row.line, seen, got.xid))
    assert wrong == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("<4>  [ 1.0] NVRM: x", "NVRM: x"),  # spaces between stacked prefixes
        ("NVRM: a\\x1bb", "NVRM: a\x1bb"),  # a kmsg escape with a hex letter
        ("<4>" * 8 + "NVRM: x", "NVRM: x"),
        ("<4>" * 9 + "NVRM: x", "<4>NVRM: x"),  # at most eight rounds: a bound on the work
    ],
)
def test_message_of_by_table(line: str, message: str) -> None:
    assert message_of(line) == message


@pytest.mark.parametrize(
    ("text", "bus_id"),
    [
        ("(0000:01:00.0)", "0000:01:00.0"),
        ("[0000:01:00.0]", "0000:01:00.0"),
        ("pci:0000:01:00", "0000:01:00.0"),  # the tag in any case
        ("001a:1f", "0000:1a:1f.0"),  # legacy bus:device, both hexadecimal
        ("001a:20", None),  # device 0x20 is past the last (0x1f)
    ],
)
def test_normalize_bus_id_by_table(text: str, bus_id: str | None) -> None:
    assert normalize_bus_id(text) == bus_id


def test_a_gpu_id_alone_names_the_bus() -> None:
    got = classify("[drm] nvidia-drm [GPU ID 0x00008800]: Loading driver")
    assert (got.vendor, got.pci_bus_id, got.xid) == ("nvidia", "0000:88:00.0", None)


def test_an_amd_line_is_amd_and_has_no_xid() -> None:
    got = classify(
        "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3"
    )
    assert (got.vendor, got.fault_class, got.pci_bus_id, got.xid) == (
        "amd",
        FaultClass.GPU_HANG,
        "0000:03:00.0",
        None,
    )
