"""docs/scaling.md lists every metric gpusvd exports (docs/tutorial.md says it does), a
counter under its exported name, with `_total`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FAMILY = re.compile(r'(Counter|Gauge|Histogram)MetricFamily\(\s*"(gpusv_\w+)"')


def test_scaling_md_lists_every_metric() -> None:
    source = (ROOT / "supervisor/daemon/watch/metrics_render.py").read_text()
    names = {name + "_total" * (kind == "Counter") for kind, name in FAMILY.findall(source)}
    assert len(names) > 15  # the pattern still finds them
    doc = (ROOT / "docs/scaling.md").read_text()
    assert sorted(n for n in names if f"`{n}`" not in doc) == []
    for name in re.findall(r"`(gpusv_\w+_total)`", (ROOT / "docs/operations.md").read_text()):
        assert name in names or name.removesuffix("_total") in names, name
    for name in re.findall(r"counter `(gpusv_\w+)`", (ROOT / "docs/operations.md").read_text()):
        assert name.endswith("_total"), f"the counter {name} is exported as {name}_total"
