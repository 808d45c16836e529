"""`gpusv classify-kernel-log [FILE|-] [--json]`: classify a kernel log offline, line by line.

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

from supervisor.faults.classifier import Classification, Classifier


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


def _write_all(source: BinaryIO, out: TextIO, as_json: bool) -> None:
    classifier = Classifier()
    render = format_json if as_json else format_plain
    for line in _lines(source):
        out.write(render(classifier.feed(line)) + "\n")
    out.flush()


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
            _write_all(source, sys.stdout, args.json)
        except BrokenPipeError:
            # The reader went away (`| head`); keep Python from complaining at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
