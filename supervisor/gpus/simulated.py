"""Simulated cards driven by small JSON control files, so that GPU failures can be tested anywhere.

Card i has PCI bus id `0000:{i+1:02x}:00.0` and a control file
`STATE_DIR/simulated-gpus/{i}.json`, re-read on every query:
`{"utilization_pct": 0, "vram_used_mb": 0, "lost": false, "wedged": false, "processes": {}}`.
`processes` maps a pid (as a string) to the MiB that process holds on the card: the card's
used VRAM is `vram_used_mb` plus their sum, and the per-process figures are what NVML's
process list would say.
`lost` makes queries raise GpuLost as NVML does for a card off the bus; `wedged` makes
them block until it is cleared, as NVML does on a hung card (at start too: the card then
starts lost after the probe deadline). `utilization_pct: null` is a card that cannot
report its load, as a MIG-mode NVIDIA card or an AMD card without gpu_busy_percent.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from supervisor.gpus.base import GpuError, GpuInfo, GpuLost
from supervisor.gpus.probing import DEFAULT_DEADLINE_S, Pending, Prober
from supervisor.gpus.visibility import visibility_env

NAME = "Simulated GPU"
DRIVER_VERSION = "550.54.15"
CONTROL_DIR = "simulated-gpus"
POLL_S = 0.05
MAX_CARDS = 64

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


@dataclass(frozen=True)
class SimulatedSpec:
    count: int
    vram_mb: int


def parse_spec(spec: str) -> SimulatedSpec:
    """Parse "NxSIZE": "2x24G" -> SimulatedSpec(2, 24576). ValueError says what is wrong."""
    head = f"bad GPU simulation spec {spec!r}"
    count_text, sep, size_text = spec.strip().partition("x")
    if not sep:
        count_text, sep, size_text = spec.strip().partition("X")
    if not sep:
        raise ValueError(f"{head}: expected NxSIZE, e.g. 2x24G")
    count_text, size_text = count_text.strip(), size_text.strip()
    if not (count_text.isascii() and count_text.isdigit()):
        raise ValueError(f"{head}: card count {count_text!r} is not a whole number")
    count = int(count_text)
    if not 1 <= count <= MAX_CARDS:
        raise ValueError(f"{head}: card count must be 1 to {MAX_CARDS}, not {count}")
    if not size_text:
        raise ValueError(f"{head}: the VRAM size after 'x' is missing, e.g. 2x24G")
    m = _SIZE.match(size_text)
    if m is None:
        raise ValueError(
            f"{head}: {size_text!r} is not a size (a number with an optional K, M, G or T suffix)"
        )
    vram_mb = int(float(m[1]) * _UNITS[m[2].upper()]) // 1024**2
    if vram_mb < 1:
        raise ValueError(f"{head}: {size_text!r} is less than 1 MiB of VRAM")
    return SimulatedSpec(count, vram_mb)


@dataclass(frozen=True)
class Control:
    """The settings of one simulated card, as its control file states them."""

    utilization_pct: float | None = 0.0
    vram_used_mb: float = 0.0
    lost: bool = False
    wedged: bool = False
    processes: dict[str, float] = field(default_factory=dict)  # pid -> MiB held


_NUMBERS = ("utilization_pct", "vram_used_mb")
_FLAGS = ("lost", "wedged")


def parse_control(raw: str | bytes) -> Control:
    """Parse a control file. Unknown keys are ignored; a missing key takes its default."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a control file holds one JSON object")
    return _control_from(data)


def _control_from(data: dict[str, Any]) -> Control:
    for key in _NUMBERS:
        value = data.get(key, 0)
        if value is None and key == "utilization_pct":
            continue
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value):
            raise ValueError(f"{key} must be a number, not {value!r}")
    for key in _FLAGS:
        if not isinstance(data.get(key, False), bool):
            raise ValueError(f"{key} must be true or false, not {data[key]!r}")
    _check_processes(data.get("processes", {}))
    known = {f.name for f in fields(Control)}
    return Control(**{k: v for k, v in data.items() if k in known})


def _check_processes(value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"processes must map pids to MiB, not {value!r}")
    for pid, mb in value.items():
        is_number = isinstance(mb, int | float) and not isinstance(mb, bool)
        if not str(pid).isdigit() or not is_number or not math.isfinite(mb) or mb < 0:
            raise ValueError(f"processes: {pid!r}: {mb!r} is not a pid and a size in MiB")


def control_path(state_dir: Path, index: int) -> Path:
    return Path(state_dir) / CONTROL_DIR / f"{index}.json"


def write_control(state_dir: Path, index: int, **values: Any) -> Path:
    """Change the given keys of card `index`'s control file atomically; others keep their values."""
    known = {f.name for f in fields(Control)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown control keys {unknown}; known: {sorted(known)}")
    path = control_path(state_dir, index)
    current: dict[str, Any] = asdict(Control())
    with contextlib.suppress(OSError, ValueError):  # absent or unreadable: the defaults
        current.update(asdict(parse_control(path.read_bytes())))
    current.update(values)
    _control_from(current)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A reader must see the old file or the new one, never half of one: write, then rename.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(current, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def simulated_bus_id(index: int) -> str:
    return f"0000:{index + 1:02x}:00.0"


def simulated_uuid(index: int) -> str:
    return f"GPU-5eed0000-0000-4000-8000-{index:012x}"


class SimulatedBackend:
    """N cards of the same size; each query reads that card's control file afresh."""

    def __init__(
        self, spec: SimulatedSpec, state_dir: Path, *, probe_deadline_s: float = DEFAULT_DEADLINE_S
    ) -> None:
        self._spec = spec
        self._prober = Prober(probe_deadline_s)
        self._state_dir = Path(state_dir)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._last_good = [Control()] * spec.count
        for i in range(spec.count):
            # An existing file is kept: a restarted daemon must see what a test had set.
            if not control_path(self._state_dir, i).exists():
                write_control(self._state_dir, i)
            self._read(i)

    def card_count(self) -> int:
        return self._spec.count

    def discover(self) -> list[GpuInfo]:
        cards = []
        for i, result in enumerate(self._prober.each(self._spec.count, self.query)):
            if not isinstance(result, GpuInfo):
                if isinstance(result, Pending):
                    result = GpuLost(f"simulated GPU {i} blocked past {result.deadline_s:g} s")
                if not isinstance(result, GpuLost):
                    raise result
                result = self._info(i, Control(), lost=True)
            cards.append(result)
        return cards

    def query(self, index: int) -> GpuInfo:
        self._check(index)
        self._prober.check(index, f"simulated GPU {index}")
        while True:
            control = self._read(index)
            if not control.wedged:
                break
            if self._closed.wait(POLL_S):
                raise GpuError(f"simulated GPU {index}: backend closed while the card was wedged")
        if control.lost:
            raise GpuLost(f"simulated GPU {index} ({simulated_bus_id(index)}) is lost")
        return self._info(index, control, lost=False)

    def process_vram_mb(self, index: int) -> dict[int, int]:
        self._check(index)
        control = self._read(index)
        if control.lost:
            raise GpuLost(f"simulated GPU {index} ({simulated_bus_id(index)}) is lost")
        return {int(pid): int(mb) for pid, mb in control.processes.items()}

    def visibility_env(self, cards: Sequence[GpuInfo]) -> dict[str, str]:
        return visibility_env(cards, {"simulated"})

    def close(self) -> None:
        self._closed.set()

    def reopen(self) -> None:
        self._closed.clear()

    def _check(self, index: int) -> None:
        if not 0 <= index < self._spec.count:
            raise GpuError(f"no simulated GPU {index} (there are {self._spec.count})")

    def _read(self, index: int) -> Control:
        """The control file's settings, or the last good ones while it is missing or invalid."""
        try:
            control = parse_control(control_path(self._state_dir, index).read_bytes())
        except (OSError, ValueError):
            with self._lock:
                return self._last_good[index]
        with self._lock:
            self._last_good[index] = control
        return control

    def _info(self, index: int, control: Control, *, lost: bool) -> GpuInfo:
        total = self._spec.vram_mb
        held = control.vram_used_mb + sum(control.processes.values())
        used = 0 if lost else min(max(int(held), 0), total)
        raw = control.utilization_pct
        util = None if lost or raw is None else min(max(float(raw), 0.0), 100.0)
        return GpuInfo(
            index=index,
            vendor="simulated",
            vendor_index=index,
            name=NAME,
            pci_bus_id=simulated_bus_id(index),
            vram_total_mb=total,
            vram_used_mb=used,
            utilization_pct=util,
            driver_version=DRIVER_VERSION,
            health="lost" if lost else "ok",
            uuid=simulated_uuid(index),
        )
