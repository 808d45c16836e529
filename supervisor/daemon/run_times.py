"""How long each kind of job (its memory key) last took to succeed: a kind that ran short
is one worth claiming the next job behind (the dispatch loop's start ahead)."""

from __future__ import annotations

from collections import OrderedDict

from supervisor.core.commands import AttemptEnded
from supervisor.daemon.clock import epoch_from_iso

SHORT_KINDS = 4096  # kinds of job whose last run time is remembered, most recent first


class RunTimes(OrderedDict[str, float]):
    """kind -> its last success, s; the kinds least recently seen are forgotten first."""

    def ran(self, ended: AttemptEnded) -> None:
        a = ended.attempt
        if a.exit_code != 0 or a.reason is not None or a.ended_at is None:
            return
        key = ended.job.spec.mem_key
        self[key] = epoch_from_iso(a.ended_at) - epoch_from_iso(a.started_at)
        self.move_to_end(key)
        if len(self) > SHORT_KINDS:
            self.popitem(last=False)
