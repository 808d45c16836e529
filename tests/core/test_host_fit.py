"""A figure above what jobs may use together is told at submit, and still starts alone."""

from __future__ import annotations

from supervisor.core.host_fit import OVER_LIMIT, over_limit
from supervisor.core.projection import Projection
from supervisor.core.records import Event

LIMIT, RESERVE = 61_440, 3_072  # 60 GiB, 3 GiB: jobs together may use 57 GiB


def test_a_figure_that_fits_is_not_told() -> None:
    assert over_limit(None, limit_mb=LIMIT, reserve_mb=RESERVE) is None
    fits = Projection(LIMIT - RESERVE, "declared", 0)
    assert over_limit(fits, limit_mb=LIMIT, reserve_mb=RESERVE) is None


def test_a_declared_need_above_the_limit_is_told_with_the_figures() -> None:
    ev = over_limit(Projection(65_536, "declared", 5, 727), limit_mb=LIMIT, reserve_mb=RESERVE)
    assert ev == Event(
        OVER_LIMIT,
        "needs ~64 GiB of host RAM (declared with --mem), more than the ~57 GiB that jobs may "
        "use together (host_memory limit ~60 GiB less the reserve of ~3 GiB): it will start "
        "only when no other job runs",
        {"projected_mb": 65_536, "basis": "declared", "room_mb": 58_368},
    )


def test_a_projected_need_names_its_runs() -> None:
    ev = over_limit(Projection(70_000, "observed", 3, 66_000), limit_mb=LIMIT, reserve_mb=RESERVE)
    assert ev is not None and "(projected from 3 earlier runs)" in ev.message
    floor = over_limit(Projection(70_000, "observed", 0), limit_mb=LIMIT, reserve_mb=RESERVE)
    assert floor is not None and "killed for memory" in floor.message


# That such a job still starts when nothing else runs is admission's lone-job rule:
# tests/core/test_admission.py and tests/integration/test_memory_kinds.py.
