"""Keepers are watched: one that stops answering (stopped, wedged) is found within
seconds, said, and worked around until it answers again.

Every `ping_s` each attached keeper is pinged on its own connection; anything it sends
answers the ping. A ping unanswered for `silent_after_s` makes the keeper "not
answering": a warning in gpusvd's log with its card, a problem in `gpusv health`, its
`keeper` field in `gpusv gpus`, its card placing no new job, and a stop of its jobs no
longer waits on it: after the kill grace gpusvd kills the job's cgroup itself
(handles.py) and records the end. The first message heard again undoes
it all. A keeper whose process is gone is not watched here: its jobs end `interrupted`
(runner.py) and the next start starts a new keeper. A keeper that did not answer the
attach at gpusvd's start (Keepers.unreached) blocks its card too, and is tried again
each round until it answers (Keepers.reach_again).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import structlog

from supervisor.daemon.running.keeper_calls import Keeper

log = structlog.get_logger("gpusvd.keepers")

PING_S = 1.0  # how often a keeper is asked; it answers in well under a millisecond
SILENT_AFTER_S = 5.0  # config [jobs] keeper_silent_s: a keeper busy on one request is not silent


def silent(asked: float | None, now: float, after_s: float) -> bool:
    """Whether a keeper asked at `asked` (None: nothing unanswered) counts as not
    answering at `now`."""
    return asked is not None and now - asked >= after_s


def card_of(name: str) -> int | None:
    """The card a keeper serves (keepers.keeper_name): gpuN -> N; the CPU keeper: None."""
    return int(name[3:]) if name.startswith("gpu") and name[3:].isdigit() else None


def _what(name: str) -> str:
    """What a keeper that does not answer costs, for `gpusv health`."""
    if card_of(name) is not None:
        return "its card takes no new jobs"
    return "CPU jobs sent to it wait until it answers"


class KeeperWatch:
    def __init__(
        self,
        keepers: Callable[[], dict[str, Keeper]],
        *,
        silent_after_s: float = SILENT_AFTER_S,
        ping_s: float = PING_S,
        on_change: Callable[[], None] = lambda: None,
        unreached: Callable[[], dict[str, str]] = dict,
        reach: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.keepers = keepers
        self.unreached = unreached  # keepers not attached at start: tried with `reach`
        self.reach = reach
        self.silent_after_s = silent_after_s
        self.ping_s = min(ping_s, silent_after_s / 2)
        self.on_change = on_change

    def not_answering(self) -> dict[str, Keeper]:
        """The keepers that do not answer now, by name."""
        return {
            name: k
            for name, k in self.keepers().items()
            if k.silent_since is not None and not k.gone
        }

    def blocked(self) -> set[str]:
        return set(self.not_answering()) | set(self.unreached())

    def blocked_cards(self) -> set[int]:
        """Cards that take no new job: their keeper does not answer."""
        return {c for c in map(card_of, self.blocked()) if c is not None}

    def problems(self, now: float) -> list[str]:
        """For `gpusv health`: one line a keeper not answering."""
        out = []
        for name, k in sorted(self.not_answering().items()):
            since = now - (k.asked if k.asked is not None else now)
            out.append(f"keeper {name} (pid {k.pid}) not answering for {since:.0f}s: {_what(name)}")
        for name in sorted(self.unreached()):
            out.append(f"keeper {name} did not answer gpusvd's attach: {_what(name)}")
        return out

    def check(self, now: float) -> None:
        """One round: decide who is silent, who answers again; ping every keeper."""
        changed = False
        for name, keeper in list(self.keepers().items()):
            if keeper.gone or keeper.closing:
                changed |= keeper.silent_since is not None
                keeper.silent_since = None
                continue
            quiet = silent(keeper.asked, now, self.silent_after_s)
            if quiet and keeper.silent_since is None:
                keeper.silent_since = now
                changed = True
                waited = now - (keeper.asked or now)
                log.warning(
                    "keeper not answering: its card takes no new jobs, its jobs' stops "
                    "go to their cgroups",
                    keeper=name,
                    card=card_of(name),
                    pid=keeper.pid,
                    waited_s=round(waited, 1),
                )
            elif not quiet and keeper.silent_since is not None:
                log.warning(
                    "keeper answers again",
                    keeper=name,
                    card=card_of(name),
                    pid=keeper.pid,
                    silent_s=round(now - keeper.silent_since, 1),
                )
                keeper.silent_since = None
                changed = True
            keeper.ping(now)
        if changed:
            self.on_change()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        if self.unreached():
            self.on_change()  # keepers not attached at start: their cards wait, from the first pass
        task_status.started()
        while True:
            self.check(time.monotonic())
            for name in list(self.unreached()):
                if self.reach is not None:
                    await self.reach(name)
            await anyio.sleep(self.ping_s)
