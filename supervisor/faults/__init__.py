"""GPU fault detection: kernel-log classification, kernel-log sources, no-progress watchdog.

The classifier and the watchdog are pure; the sources (`supervisor.faults.sources`) are the
I/O edge and are imported from there, so that the offline `classify-kernel-log` command
loads no event-loop machinery.
"""

from supervisor.faults.classifier import (
    Classification,
    Classifier,
    FaultClass,
    classify,
    normalize_bus_id,
)
from supervisor.faults.watchdog import ProgressState, ProgressTracker, check_progress

__all__ = [
    "Classification",
    "Classifier",
    "FaultClass",
    "ProgressState",
    "ProgressTracker",
    "check_progress",
    "classify",
    "normalize_bus_id",
]
