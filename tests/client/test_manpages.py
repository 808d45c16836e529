"""The man pages in man/ are what scripts/manpages.py writes from the parsers now, and
the package installs them."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
STALE = "man/{}.1 is stale: run `.venv/bin/python scripts/manpages.py` and commit man/"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("manpages", ROOT / "scripts/manpages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_man_pages_are_current() -> None:
    script = _script()
    for prog in script.PAGES:
        text = (ROOT / "man" / f"{prog}.1").read_text()
        header = re.match(r'\.TH \S+ "1" "(.+?)" "gpusv (.+?)"', text)
        assert header is not None, text[:200]
        date, version = header.group(1).replace("\\-", "-"), header.group(2)
        assert script.page(prog, date, version) == text, STALE.format(prog)


def test_the_man_pages_name_every_command_and_say_the_exit_codes() -> None:
    gpusv = (ROOT / "man/gpusv.1").read_text().replace("\\-", "-")
    for word in ("submit", "list", "--name", "--label", "completion", "2 bad usage"):
        assert word in gpusv
    gpusvd = " ".join((ROOT / "man/gpusvd.1").read_text().replace("\\-", "-").split())
    assert "70 the deadman" in gpusvd


def test_the_package_installs_them() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["data-files"]["share/man/man1"] == ["man/*.1"]
