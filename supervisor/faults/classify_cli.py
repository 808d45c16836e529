"""`gpusv classify-kernel-log [FILE|-] [--json] [--faults-only]`: classify a kernel log
offline, line by line.

Needs no daemon. Reads FILE (or standard input), and prints one result per input line, in
order: a plain column listing, or with --json one object per line as the daemon would see it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO, TextIO

from supervisor.faults.classifier import Classification, Classifier, FaultClass

NODE_FAULTS = frozenset({FaultClass.GPU_HANG, FaultClass.GPU_LOST})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpusv classify-kernel-log",
        description="Classify kernel-log lines: gpu_hang, gpu_lost, app_fault or benign, "
        "with the vendor, the GPU's PCI bus id and the NVIDIA Xid.",
    )
    parser.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="a kernel log; - or none: stdin"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per input line")
    parser.add_argument(
        "--faults-only",
        dest="faults_only",
        action="store_true",
        help="print only gpu_hang, gpu_lost and app_fault lines; exit 1 if a hang or lost "
        "card was found (a node-problem-detector custom plugin)",
    )
    return parser


def format_plain(result: Classification) -> str:
    xid = f"xid={result.xid}" if result.xid is not None else "-"
    return (
        f"{result.fault_class.value:<9}  {result.vendor or '-':<6}  "
        f"{result.pci_bus_id or '-':<12}  {xid:<7}  {result.line}"
    )


def format_json(result: Classification) -> str:
    return json.dumps(result.to_json(), ensure_ascii=False)


def _lines(stream: BinaryIO) -> Iterator[str]:
    for raw in stream:
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


def _write_all(source: BinaryIO, out: TextIO, as_json: bool, faults_only: bool = False) -> bool:
    """Print each line's class; True when a gpu_hang or gpu_lost line was seen."""
    classifier = Classifier()
    render = format_json if as_json else format_plain
    found = False
    for line in _lines(source):
        result = classifier.feed(line)
        found |= result.fault_class in NODE_FAULTS
        if not faults_only or result.fault_class is not FaultClass.BENIGN:
            out.write(render(result) + "\n")
    out.flush()
    return found


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already reported by argparse
        return exc.code if isinstance(exc.code, int) else 2
    with contextlib.ExitStack() as stack:
        source: BinaryIO = sys.stdin.buffer
        if args.file != "-":
            try:
                source = stack.enter_context(open(args.file, "rb"))
            except OSError as exc:
                reason = exc.strerror or str(exc)
                print(
                    f"gpusv classify-kernel-log: cannot read {args.file}: {reason}", file=sys.stderr
                )
                return 2
        try:
            found = _write_all(source, sys.stdout, args.json, args.faults_only)
        except BrokenPipeError:
            # The reader went away (`| head`); keep Python from complaining at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            found = False
    return 1 if args.faults_only and found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
