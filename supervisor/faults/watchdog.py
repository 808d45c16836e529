"""The no-progress watchdog: a job whose output stopped while it sits idle is hung.

Pure: the daemon feeds a `ProgressTracker` per running job (output, output sizes, GPU
utilization and CPU samples, all with monotonic times) and asks `verdict` for a ruling.

Two rules:
- idle (`timeout_s`): no progress for that long while the job was idle all along. Idle
  means its GPUs read <= 1 % AND its processes did not use the CPU: low GPU utilization
  alone is not a hang (a job may render on the CPU or load data), and neither is silence
  alone (a job may compute for hours without printing). A card whose utilization cannot
  be read is never idle: unknown is not 0 %.
- stalled (`stall_timeout_s`): no progress for that long, whatever the load. This catches
  a hung collective, which spins its GPUs at ~100 % without doing anything; the job must
  print (or match --progress-regex) more often than this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import regex as regex_module

LOW_UTIL_PCT = 1.0  # a card at or under this is idle
# A job tree using less than this share of one core between two samples is idle on the CPU:
# a process blocked on a hung GPU sleeps, while a CPU render or a data loader does not.
CPU_IDLE_PCT = 5.0
_MAX_PENDING = 64 * 1024  # an unterminated line longer than this is searched as it is
MATCH_TIMEOUT_S = 0.05  # per line: far beyond any sane progress pattern


@dataclass(frozen=True)
class ProgressState:
    last_progress_at: float  # monotonic; output growth, or a --progress-regex match
    low_util_since: float | None  # since when all the job's cards have been <= 1 %; None: busy
    max_util_seen: float  # highest utilization sampled since the last progress
    util_unknown: bool = False  # a card of the job could not report utilization lately
    max_cpu_pct: float = 0.0  # highest CPU use (% of one core) since the last progress


Verdict = Literal["ok", "idle", "stalled"]


def verdict(
    state: ProgressState,
    *,
    now: float,
    timeout_s: float | None,
    stall_timeout_s: float | None = None,
) -> Verdict:
    """ "stalled" past `stall_timeout_s` without progress at any load; "idle" as
    check_progress says "hung"; else "ok"."""
    if stall_timeout_s and stall_timeout_s > 0 and now - state.last_progress_at >= stall_timeout_s:
        return "stalled"
    return "idle" if check_progress(state, now=now, timeout_s=timeout_s) == "hung" else "ok"


def check_progress(
    state: ProgressState, *, now: float, timeout_s: float | None
) -> Literal["ok", "hung"]:
    """ "hung" when `timeout_s` passed without progress and the job was idle all along."""
    if timeout_s is None or timeout_s <= 0:
        return "ok"
    if now - state.last_progress_at < timeout_s or state.low_util_since is None:
        return "ok"
    idle_throughout = (
        state.low_util_since <= state.last_progress_at or state.low_util_since <= now - timeout_s
    )
    return "hung" if idle_throughout else "ok"


def watchdog_evidence(
    state: ProgressState,
    ruling: Verdict,
    now: float,
    timeout_s: float | None,
    stall_timeout_s: float | None,
) -> dict[str, object]:
    """What the watchdog saw, for the attempt's evidence: which rule fired and on what."""
    rule = (
        f"no progress for {stall_timeout_s:g} s at any utilization (stall_timeout_s)"
        if ruling == "stalled"
        else f"no progress for {timeout_s:g} s while GPU and CPU sat idle (progress_timeout_s)"
    )
    return {
        "source": "watchdog",
        "rule": rule,
        "silent_s": round(now - state.last_progress_at, 1),
        "max_utilization_pct": state.max_util_seen,
        "utilization_unknown": state.util_unknown,
        "max_cpu_percent": state.max_cpu_pct,
    }


def job_utilization(readings: list[float | None]) -> float | None:
    """The utilization the watchdog judges a job by: its busiest card, or None (unknown)
    when no card is busy and one of them could not be read."""
    known = [r for r in readings if r is not None]
    top = max(known, default=0.0)
    if top > LOW_UTIL_PCT or len(known) == len(readings):
        return top
    return None


class ProgressTracker:
    """Progress of one running job.

    Without a regex any output growth is progress. With one, only a match is: the matched
    text (group 1 if the regex has a group, else the whole match) becomes `last_match`, e.g.
    "Fra:942", for `gpusv list` and `show`. Output is matched line by line (`\\n` or `\\r`,
    so that progress bars count), across chunk boundaries.
    """

    def __init__(self, regex: str | None, started_at: float) -> None:
        # `regex` rather than `re`: a user's pattern such as (a+)+$ must not be able to
        # stall the daemon; every match runs under a time limit. Imported here, by the first
        # job that has a pattern: a daemon whose jobs have none is spared its ~1 MiB.
        self._pattern: regex_module.Pattern[str] | None = None
        if regex:
            import regex as regex_module

            self._pattern = regex_module.compile(regex)
        self.regex_gave_up = False
        self._last_progress_at = started_at
        self._low_since: float | None = None
        self._max_util = 0.0
        self._unknown = False
        self._unknown_told = False
        self._max_cpu = 0.0
        self._last_cpu: tuple[float, float] | None = None  # (cpu seconds, at)
        self._size = 0
        self._pending = ""
        self.last_match: str | None = None

    def on_output(self, chunk: str, now: float) -> None:
        """New output text of the job (stdout or stderr)."""
        if not chunk:
            return
        if self._pattern is None:
            self._progress(now)
            return
        *lines, self._pending = re.split(r"[\r\n]", self._pending + chunk)
        if len(self._pending) > _MAX_PENDING:
            lines.append(self._pending)
            self._pending = ""
        for line in lines:
            self._match(line, now)

    def on_size(self, total_bytes: int, now: float) -> None:
        """Total size of the job's output files; growth is progress unless a regex is set."""
        grew = total_bytes > self._size
        self._size = total_bytes
        if grew and self._pattern is None:
            self._progress(now)

    def on_utilization(self, pct: float | None, now: float, cpu_s: float | None = None) -> None:
        """One sample: the highest utilization among the job's cards (None: a card could
        not tell) and the CPU seconds the job's processes have used in all (None: not
        measured)."""
        cpu_pct = self._cpu_pct(cpu_s, now)
        self._unknown = pct is None
        if pct is not None:
            self._max_util = max(self._max_util, pct)
        if cpu_pct is not None:
            self._max_cpu = max(self._max_cpu, cpu_pct)
        cpu_busy = cpu_pct is not None and cpu_pct >= CPU_IDLE_PCT
        if pct is None or pct > LOW_UTIL_PCT or cpu_busy:
            self._low_since = None
        elif self._low_since is None:
            self._low_since = now

    def first_unknown(self) -> bool:
        """True once, at the first sample whose utilization was unknown: the time to say
        that the idle rule cannot judge this job (only the stall rule can)."""
        if not self._unknown or self._unknown_told:
            return False
        self._unknown_told = True
        return True

    def _cpu_pct(self, cpu_s: float | None, now: float) -> float | None:
        last, self._last_cpu = self._last_cpu, (None if cpu_s is None else (cpu_s, now))
        if cpu_s is None or last is None or now <= last[1]:
            return None
        # Processes that exited take their seconds with them: a drop is not negative use.
        return round(100.0 * max(0.0, cpu_s - last[0]) / (now - last[1]), 1)

    def state(self) -> ProgressState:
        return ProgressState(
            self._last_progress_at, self._low_since, self._max_util, self._unknown, self._max_cpu
        )

    def _match(self, line: str, now: float) -> None:
        assert self._pattern is not None
        try:
            matches = list(self._pattern.finditer(line, timeout=MATCH_TIMEOUT_S))
        except TimeoutError:
            # A pattern that backtracks for ever is dropped; output growth counts again.
            self._pattern = None
            self.regex_gave_up = True
            self._progress(now)
            return
        if not matches:
            return
        found = matches[-1]  # the latest, when a line holds several
        group = found.group(1) if self._pattern.groups else None
        self.last_match = group if group is not None else found.group(0)
        self._progress(now)

    def _progress(self, now: float) -> None:
        self._last_progress_at = max(self._last_progress_at, now)
        self._max_util = 0.0
        self._max_cpu = 0.0
