"""The score on lines the rules were not written from: tests/data/kernel-log-heldout.tsv
holds the rows of every fourth source collected (12 of 49 public reports), set aside before
any rule was written and never tuned against. The classifier must class at least 98 % of
them right (class, vendor, bus id and Xid) and call no benign line a fault."""

from __future__ import annotations

from bench.classifier_score import DATA, Row, Score, read_rows, score
from supervisor.faults.classifier import Classification, Classifier, FaultClass

HELDOUT = DATA / "kernel-log-heldout.tsv"
THRESHOLD = 0.98


def passes(result: Score) -> bool:
    return result.accuracy >= THRESHOLD and result.benign_called_fault == 0


def test_heldout_score() -> None:
    result = score(read_rows(HELDOUT))
    assert result.rows >= 100
    wrong = [(row.line, got) for row, got in result.misses]
    assert result.benign_called_fault == 0, wrong
    assert result.accuracy >= THRESHOLD, wrong
    assert passes(result)


class _EverythingHangs(Classifier):
    """A classifier broken on purpose: every GPU line is a hang."""

    def feed(self, line: str) -> Classification:
        got = super().feed(line)
        if got.vendor is None:
            return got
        return Classification(line, got.vendor, FaultClass.GPU_HANG, got.pci_bus_id, got.xid)


class _ForgetsBusIds(Classifier):
    def feed(self, line: str) -> Classification:
        got = super().feed(line)
        return Classification(line, got.vendor, got.fault_class, None, got.xid)


def test_the_score_fails_a_broken_classifier() -> None:
    rows = read_rows(HELDOUT)
    hangs = score(rows, _EverythingHangs())
    assert hangs.benign_called_fault > 0 and not passes(hangs)
    blind = score(rows, _ForgetsBusIds())
    assert blind.benign_called_fault == 0 and blind.accuracy < THRESHOLD and not passes(blind)


def test_one_benign_line_called_a_fault_fails_even_at_full_accuracy_elsewhere() -> None:
    rows = [Row("amd", "benign", "0000:03:00.0", "", "amdgpu 0000:03:00.0: GPU reset begin!", "x")]
    result = score(rows * 100)
    assert result.benign_called_fault == 100 and not passes(result)
