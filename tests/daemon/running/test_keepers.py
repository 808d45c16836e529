"""gpusvd asks a keeper only for what its attach announced."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

from supervisor.daemon.running.keepers import Keeper, Keepers, _spawn_fields
from supervisor.keeper.spawn import Spec


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


def test_a_spawn_request_carries_every_field_of_the_spec_as_it_is() -> None:
    """Taken from the spec's __dict__: every field, in its order, the environment the
    same object (not copied a job), and none that is not a field."""
    env = {"PATH": "/usr/bin"}
    spec = Spec(1, 2, ("true",), "/", env, "/o", "/e", oom_score_adj=1000, index="/i")
    fields = _spawn_fields(spec)
    assert list(fields) == [f.name for f in dataclasses.fields(Spec)]
    assert all(fields[f.name] is getattr(spec, f.name) for f in dataclasses.fields(Spec))
