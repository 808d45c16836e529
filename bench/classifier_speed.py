"""The kernel-log classifier's speed: `python -m bench.classifier_speed [--rounds N]`.

The classifier runs on every kernel line the daemon reads, so its cost is per line. This
feeds every line of the labelled corpora (tests/data/kernel-log-*.tsv) through one
`Classifier` in file order, repeatedly, and prints the lines per second of the best round
(the least disturbed by other work on the machine), with the median beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from supervisor.faults.classifier import Classifier

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def corpus_lines(data: Path = DATA) -> list[str]:
    """The `line` column of every corpus file, in file order."""
    lines: list[str] = []
    for path in sorted(data.glob("kernel-log-*.tsv")):
        for row in path.read_text(encoding="utf-8").splitlines()[1:]:
            lines.append(row.split("\t")[4])
    return lines


def lines_per_second(lines: list[str], rounds: int) -> list[float]:
    rates: list[float] = []
    for _ in range(rounds):
        classifier = Classifier()
        start = time.perf_counter()
        for line in lines:
            classifier.feed(line)
        rates.append(len(lines) / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.classifier_speed")
    parser.add_argument("--rounds", type=int, default=50, help="passes over the corpora")
    args = parser.parse_args(argv)
    lines = corpus_lines()
    rates = lines_per_second(lines, max(1, args.rounds))
    print(
        f"{len(lines)} lines x {len(rates)} rounds: best {max(rates):,.0f} lines/s, "
        f"median {statistics.median(rates):,.0f} lines/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
