#!/usr/bin/env python3
"""Write man/gpusv.1 and man/gpusvd.1 from the two command lines' parsers, with
argparse-manpage (a test extra). The pages are installed with the package
(pyproject.toml, [tool.setuptools.data-files]) and tests/client/test_manpages.py fails
when a parser changed and they were not written again:

    .venv/bin/python scripts/manpages.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAGES = {
    "gpusv": "queue, watch and act on jobs on this machine's GPUs",
    "gpusvd": "the gpusv daemon: admits, starts and supervises the jobs",
}


def parser_of(prog: str) -> argparse.ArgumentParser:
    if prog == "gpusv":
        from supervisor.client.parser import parser
    else:
        from supervisor.daemon.life.startup import parser
    return parser()


def page(prog: str, date: str | None = None, version: str | None = None) -> str:
    """The roff text of `prog`'s man page. Its header carries `date` (default: today, or
    $SOURCE_DATE_EPOCH's day) and `version` (default: the installed package's)."""
    from importlib.metadata import version as installed

    from argparse_manpage.manpage import Manpage

    data = {
        "prog": prog,
        "project_name": "gpusv",
        "description": PAGES[prog],
        "manual_title": "gpusv manual",
        "version": version or installed("gpusv"),
    }
    if date:
        data["date"] = date
    return str(Manpage(parser_of(prog), format="pretty", _data=data))


def main() -> int:
    for prog in PAGES:
        path = ROOT / "man" / f"{prog}.1"
        path.parent.mkdir(exist_ok=True)
        path.write_text(page(prog))
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
