"""gpusvd asks a keeper only for what its attach announced."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from supervisor.daemon.running.keepers import Keeper, Keepers


def _attached(keepers: Keepers, name: str, features: frozenset[str], gone: bool = False) -> None:
    keeper = Keeper(name, keepers.home(name), cast(Any, None), features=features, gone=gone)
    keepers.keepers[name] = keeper


def test_only_a_keeper_that_announced_after_is_sent_jobs_to_start_ahead(tmp_path: Path) -> None:
    keepers = Keepers(tmp_path)
    _attached(keepers, "gpu0", frozenset({"after"}))
    _attached(keepers, "gpu1", frozenset())  # started by an older gpusvd
    _attached(keepers, "cpu", frozenset({"after"}), gone=True)
    assert keepers.can("gpu0", "after")
    assert not keepers.can("gpu1", "after")
    assert not keepers.can("cpu", "after")  # its connection is gone
    assert not keepers.can("gpu2", "after")  # not attached at all
