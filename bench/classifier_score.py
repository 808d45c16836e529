"""The kernel-log classifier's score on labelled corpora:
`python -m bench.classifier_score [FILE.tsv ...] [--misses]`.

Each file (default: every tests/data/kernel-log-*.tsv) is fed through one `Classifier` in
file order, as a log is read. A row is right when the class, the vendor, the bus id and the
Xid all match its labels. Prints, per file, the rows right and the benign rows called a
fault, then a table by vendor and by family (the family is read from the line, below) as
docs/gpu-hangs.md shows it; --misses lists the rows that were wrong.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from supervisor.faults.classifier import Classification, Classifier

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
COLUMNS = ["vendor", "class", "pci_bus_id", "xid", "line", "source"]


class Row(NamedTuple):
    vendor: str
    fault_class: str
    pci_bus_id: str
    xid: str
    line: str
    source: str


def read_rows(path: Path) -> list[Row]:
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != COLUMNS:
        raise ValueError(f"{path}: the header is not {' '.join(COLUMNS)}")
    return [Row(*line.split("\t")) for line in lines[1:]]


def seen(result: Classification) -> tuple[str, str, str, str]:
    """A result in the corpus's terms: vendor, class, bus id, Xid ("" for none)."""
    xid = "" if result.xid is None else str(result.xid)
    return (result.vendor or "", result.fault_class.value, result.pci_bus_id or "", xid)


@dataclass
class Score:
    rows: int = 0
    right: int = 0
    benign_called_fault: int = 0
    misses: list[tuple[Row, tuple[str, str, str, str]]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.right / self.rows if self.rows else 1.0


def score(rows: Iterable[Row], classifier: Classifier | None = None) -> Score:
    """Feed `rows` in order through `classifier` (a fresh one by default) and count."""
    feed = (classifier or Classifier()).feed
    result = Score()
    for row in rows:
        got = seen(feed(row.line))
        result.rows += 1
        if got == (row.vendor, row.fault_class, row.pci_bus_id, row.xid):
            result.right += 1
        else:
            result.misses.append((row, got))
        if row.fault_class == "benign" and got[1] != "benign":
            result.benign_called_fault += 1
    return result


# The families of docs/gpu-hangs.md, first match wins; read from the line, so that a table
# can be made for any corpus without a column of its own.
_FAMILIES = (
    ("power state", r"power state|not ready \d+ms|resume async|pci_pm_resume|perm_failure"),
    ("recovery action (Xid 154)", r"Xid \([^)]*\): 154\b"),
    (
        "GSP RPC timeout, GPU marked for reset",
        r"GPU marked for reset|rpcRecvPoll|_kgspLogXid119|ThreadNodeCheckTimeout|kflcnCoreDump"
        r"|Xid \([^)]*\): 119\b",
    ),
    (
        "card does not come up",
        r"RmInitAdapter|rm_init_adapter|GSP-FMC|Bootstrap|FWSEC|Booter|GSP unload|status 0x0*f\b"
        r"|status=0x0*f\b|PSP .*failed|psp firmware|microcode|\bucode\b|SMC|gpu_info"
        r"|Direct firmware load|could not load firmware|probe of|ip_init|ip_resume|IP block"
        r"|GPU init|Unknown firmware type",
    ),
    (
        "VM fault and its detail lines",
        r"page fault|PROTECTION_FAULT|UTCL2|MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS"
        r"|MAPPING_ERROR|RW: |in page starting|for process|fault from die",
    ),
    (
        "ring timeout, reset and its process line",
        r"timeout|Process|\breset\b|Dumping IP|coredump|wedged|\bMES\b|KGQ|KCQ|halt cp"
        r"|test failed|VRAM is lost|parser|suspend process|PMU has halted",
    ),
    ("other Xid", r"\bXid\b"),
    (
        "init, resume and firmware banners",
        r"firmware|ucode|PSP|SMU|VCN|JPEG|DMUB|Loading|loading|initiali[sz]ed|ip block|VRAM|GART"
        r"|CRAT|Topology|enabling device|kfd|version|modesetting|inv eng|resum(?:ing|ed)|TMR|PTB"
        r"|TMZ|ECC is not|VBIOS|ATOM|STB|RS64|kiq ring|Display Core|nvidia-drm|GPU at PCI"
        r"|Serial Number|vgaarb|Module|UVM|nvlink|active_cu|not ready \d+ms",
    ),
    ("other lines", r"."),
)
_FAMILY_RES = tuple((name, re.compile(pattern, re.I)) for name, pattern in _FAMILIES)


def family(line: str) -> str:
    for name, pattern in _FAMILY_RES:
        if pattern.search(line):
            return name
    return "other lines"


def table(title: str, rows: list[Row], missed: set[int]) -> list[str]:
    """A markdown table of `rows` by vendor or by family; `missed` holds the id() of the
    rows that were classified wrong."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        name = (row.vendor or "(none)") if title == "vendor" else family(row.line)
        groups.setdefault(name, []).append(row)
    out = [
        f"| {title} | lines | of them benign | right | accuracy | sources |",
        "|---|---|---|---|---|---|",
    ]
    for name, members in sorted(groups.items()):
        right = sum(1 for row in members if id(row) not in missed)
        sources = len({row.source for row in members})
        benign = sum(1 for row in members if row.fault_class == "benign")
        out.append(
            f"| {name} | {len(members)} | {benign} | {right} | {right / len(members):.1%} "
            f"| {sources} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.classifier_score")
    parser.add_argument("files", nargs="*", type=Path, help="corpus files (default: all)")
    parser.add_argument("--misses", action="store_true", help="list the rows that were wrong")
    args = parser.parse_args(argv)
    files: list[Path] = args.files or sorted(DATA.glob("kernel-log-*.tsv"))
    everything: list[Row] = []
    missed: set[int] = set()
    for path in files:
        rows = read_rows(path)
        result = score(rows)
        missed.update(id(row) for row, _ in result.misses)
        everything.extend(rows)
        print(
            f"{path.name}: {result.right}/{result.rows} right ({result.accuracy:.1%}), "
            f"{result.benign_called_fault} benign called a fault"
        )
        if args.misses:
            for row, got in result.misses:
                print(f"  want {row.fault_class} got {got}: {row.line}")
    counts = Counter(row.source for row in everything)
    print(f"\n{len(everything)} rows from {len(counts)} sources\n")
    print("\n".join(table("vendor", everything, missed)))
    print()
    print("\n".join(table("family", everything, missed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
