"""The host-RAM projection: how much a job of a known kind is expected to need at its peak.

Pure: every figure comes from the peaks observed on earlier attempts of the same memory key.
The rules are described for operators in docs/host-memory.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

Basis = Literal["observed", "fit", "declared"]

# Attempts whose peak describes a whole run of the job: only successes. A failed run may
# have stopped early (a bad argument, a missing file), the others were cut short from
# outside (cancel, hang, daemon restart, a signal) or never ran; an OOM kill is a floor.
QUALIFYING = frozenset({None})
OOM_KILLED = "oom_killed"
WINDOW = 10  # the last qualifying runs that count, so a job that got lighter is believed


@dataclass(frozen=True)
class MemObservation:
    """One earlier attempt of the same memory key; history is passed oldest first."""

    peak_rss_mb: int
    reason: str | None  # None: succeeded; else a FailureReason value
    scale: float | None = None
    peak_vram_mb: int | None = None


@dataclass(frozen=True)
class Projection:
    projected_mb: int
    basis: Basis
    runs: int  # the qualifying runs of the key, whichever basis won
    # The highest peak of the runs behind the history's figure, before the margin: what
    # `show` names next to a declared figure. Not part of the figure, so not compared.
    peak_mb: int | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, object]:
        return {
            "projected_mb": self.projected_mb,
            "basis": self.basis,
            "runs": self.runs,
            "peak_mb": self.peak_mb,
        }


def project(
    history: Sequence[MemObservation],
    *,
    declared_mb: int | None,
    scale: float | None,
    margin: float,
) -> Projection | None:
    """The projected peak for the next run, or None when nothing is known.

    The larger of the history's figure and a declared one: a declaration above what
    earlier runs used is the user saying this run is bigger (other inputs, a new
    model), and one below it cannot undo what was seen. On a tie history is named,
    being evidence. An oom_killed attempt is a floor under every basis.
    """
    qualifying = [h for h in history if h.reason in QUALIFYING]
    figure = _from_history(qualifying, scale, margin)
    floor = _oom_floor(history, scale, margin)
    if declared_mb is not None and (figure is None or declared_mb > figure.projected_mb):
        runs = figure.runs if figure else 0
        figure = Projection(declared_mb, "declared", runs, figure.peak_mb if figure else None)
    if figure is None:
        # Killed for memory and never completed: it needs more than it reached.
        return None if floor is None else Projection(floor, "observed", 0)
    if floor is not None and figure.projected_mb < floor:
        return replace(figure, projected_mb=floor)
    return figure


def _from_history(
    qualifying: Sequence[MemObservation], scale: float | None, margin: float
) -> Projection | None:
    if scale is None or scale <= 0:  # no usable scale: a fit would divide by it
        return _observed(qualifying, margin)
    scaled = [h for h in qualifying if h.scale is not None and h.scale > 0]
    same = [h for h in scaled if _same_scale(h.scale, scale)]
    if same:
        return _observed(same, margin)
    if scaled:
        return _fit(scaled, scale, margin)
    # Runs from before the job declared scales: the best evidence there is.
    return _observed(qualifying, margin)


def _observed(runs: Sequence[MemObservation], margin: float) -> Projection | None:
    if not runs:
        return None
    peak = max(h.peak_rss_mb for h in runs[-WINDOW:])
    return Projection(_with_margin(peak, margin), "observed", len(runs), peak)


def _fit(scaled: Sequence[MemObservation], scale: float, margin: float) -> Projection:
    """Least squares through (scale, peak) plus the worst residual, at `scale`."""
    points = _recent_per_scale(scaled)
    xs = [x for x, _ in points]
    ys = [float(y) for _, y in points]
    if len(set(xs)) == 1:
        # One scale seen: assume proportional growth upwards (safe, since part of the
        # peak is a fixed cost) and no shrinking downwards.
        peak, at = max(ys), xs[0]
        estimate = peak * scale / at if scale > at else peak
        return Projection(_with_margin(estimate, margin), "fit", len(points), int(peak))
    n = len(points)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope <= 0:
        # Memory that does not grow with scale cannot be extrapolated downwards safely.
        return Projection(_with_margin(max(ys), margin), "fit", n, int(max(ys)))
    intercept = mean_y - slope * mean_x
    worst = max(abs(y - (intercept + slope * x)) for x, y in zip(xs, ys, strict=True))
    estimate = max(0.0, intercept + slope * scale + worst)
    return Projection(_with_margin(estimate, margin), "fit", n, int(max(ys)))


def _recent_per_scale(scaled: Sequence[MemObservation]) -> list[tuple[float, int]]:
    by_scale: dict[float, list[int]] = {}
    for h in scaled:
        if h.scale is None:
            continue
        key = next((s for s in by_scale if _same_scale(s, h.scale)), h.scale)
        by_scale.setdefault(key, []).append(h.peak_rss_mb)
    return [(s, y) for s, peaks in by_scale.items() for y in peaks[-WINDOW:]]


def _oom_floor(history: Sequence[MemObservation], scale: float | None, margin: float) -> int | None:
    """The highest peak of an attempt killed for memory, with the margin on top.

    With a scale, only kills at the same or a smaller scale bind (memory is assumed not
    to shrink as scale grows); a kill whose scale is unknown binds every scale.
    """
    peaks = [
        h.peak_rss_mb
        for h in history
        if h.reason == OOM_KILLED
        and (scale is None or h.scale is None or h.scale <= scale or _same_scale(h.scale, scale))
    ]
    return _with_margin(max(peaks), margin) if peaks else None


def _same_scale(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _with_margin(peak_mb: float, margin: float) -> int:
    # round() first so that float noise (1000 * 1.05 = 1050.0000000000002) adds no MiB.
    return math.ceil(round(peak_mb * (1.0 + margin), 6))
