"""The no-progress watchdog: a job whose output stopped while its GPUs sit idle is hung.

Pure: the daemon feeds a `ProgressTracker` per running job (output, output sizes, GPU
utilization samples, all with monotonic times) and asks `check_progress` for a verdict.
Low GPU utilization alone is not a hang (a job may be loading data), and neither is silence
alone (a job may compute for hours without printing); only both together are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import regex as regex_module

LOW_UTIL_PCT = 1.0  # a card at or under this is idle
_MAX_PENDING = 64 * 1024  # an unterminated line longer than this is searched as it is
MATCH_TIMEOUT_S = 0.05  # per line: far beyond any sane progress pattern


@dataclass(frozen=True)
class ProgressState:
    last_progress_at: float  # monotonic; output growth, or a --progress-regex match
    low_util_since: float | None  # since when all the job's cards have been <= 1 %; None: busy
    max_util_seen: float  # highest utilization sampled since the last progress


def check_progress(
    state: ProgressState, *, now: float, timeout_s: float | None
) -> Literal["ok", "hung"]:
    """ "hung" when `timeout_s` passed without progress and the cards were idle all along."""
    if timeout_s is None or timeout_s <= 0:
        return "ok"
    if now - state.last_progress_at < timeout_s or state.low_util_since is None:
        return "ok"
    idle_throughout = (
        state.low_util_since <= state.last_progress_at or state.low_util_since <= now - timeout_s
    )
    return "hung" if idle_throughout else "ok"


class ProgressTracker:
    """Progress of one running job.

    Without a regex any output growth is progress. With one, only a match is: the matched
    text (group 1 if the regex has a group, else the whole match) becomes `last_match`, e.g.
    "Fra:942", for `gpusv list` and `show`. Output is matched line by line (`\\n` or `\\r`,
    so that progress bars count), across chunk boundaries.
    """

    def __init__(self, regex: str | None, started_at: float) -> None:
        # `regex` rather than `re`: a user's pattern such as (a+)+$ must not be able to
        # stall the daemon; every match runs under a time limit.
        self._pattern = regex_module.compile(regex) if regex else None
        self.regex_gave_up = False
        self._last_progress_at = started_at
        self._low_since: float | None = None
        self._max_util = 0.0
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

    def on_utilization(self, pct: float, now: float) -> None:
        """One sample: the highest utilization among the job's cards."""
        self._max_util = max(self._max_util, pct)
        if pct > LOW_UTIL_PCT:
            self._low_since = None
        elif self._low_since is None:
            self._low_since = now

    def state(self) -> ProgressState:
        return ProgressState(self._last_progress_at, self._low_since, self._max_util)

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
