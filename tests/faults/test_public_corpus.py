"""Every row of the corpora grown from public reports (tests/data/kernel-log-public.tsv, the
development set, and kernel-log-heldout.tsv, the set aside), classified in file order as a
log is read: class, vendor, bus id and Xid as labelled, and each row's source a public URL."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from bench.classifier_score import DATA, Row, read_rows, score, seen
from supervisor.faults.classifier import Classification, Classifier

FILES = ("kernel-log-public.tsv", "kernel-log-heldout.tsv")


def _fed(name: str) -> Iterator[tuple[Row, Classification]]:
    classifier = Classifier()
    for row in read_rows(DATA / name):
        yield row, classifier.feed(row.line)


CASES = [
    pytest.param(row, result, id=f"{name.split('-')[-1].removesuffix('.tsv')}:{n + 2}")
    for name in FILES
    for n, (row, result) in enumerate(_fed(name))
]


@pytest.mark.parametrize(("row", "result"), CASES)
def test_row(row: Row, result: Classification) -> None:
    assert seen(result) == (row.vendor, row.fault_class, row.pci_bus_id, row.xid), row.line
    assert result.line == row.line


@pytest.mark.parametrize("name", FILES)
def test_every_row_names_a_public_report(name: str) -> None:
    rows = read_rows(DATA / name)
    assert all(re.fullmatch(r"https://\S+", row.source) for row in rows)
    assert all(row.fault_class in {"gpu_hang", "gpu_lost", "app_fault", "benign"} for row in rows)


def test_the_two_sets_share_no_source_and_hold_at_least_300_lines() -> None:
    public, heldout = (read_rows(DATA / name) for name in FILES)
    assert {r.source for r in public}.isdisjoint({r.source for r in heldout})
    assert len(public) + len(heldout) >= 300
    # About a quarter of the sources are held out, and every class is among them.
    sources = {r.source for r in public} | {r.source for r in heldout}
    assert len({r.source for r in heldout}) >= len(sources) // 5
    assert {r.fault_class for r in heldout} == {"gpu_hang", "gpu_lost", "app_fault", "benign"}


def test_no_line_is_repeated_within_the_new_sets() -> None:
    lines = [row.line for name in FILES for row in read_rows(DATA / name)]
    assert len(lines) == len(set(lines))


@pytest.mark.parametrize("name", FILES)
def test_each_file_in_file_order_inside_one_test(name: str) -> None:
    # The per-row cases above are classified while the tests are collected, out of sight of
    # a mutation run (docs/testing.md); this classifies them again inside a test.
    result = score(read_rows(DATA / name))
    assert [(row.line, got) for row, got in result.misses] == []
