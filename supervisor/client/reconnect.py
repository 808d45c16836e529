"""Riding through a daemon restart: whether a lost daemon is coming back, how long to wait
for it, and which requests may be sent to the next one.

The rule (docs/operations.md, "What a restart means for clients"): a daemon is
restarting when its socket file is there but refuses connections. gpusvd removes its
socket only when it stops (a drain); after a crash, `kill -9`, the deadman's exit 70, the
watchdog or `systemctl restart` the socket stays, refusing, until the next gpusvd binds a
new one over it (the unit keeps /run/gpusvd through a restart). No socket file at all
means no daemon is coming: a command fails at once, unless systemd says gpusvd's unit is
starting (`activating`), which covers the start of the system daemon, before its first
socket exists.

The lean commands (quick.py: `list`, `show`, `submit`, `run`) import it only once a
connection has failed: the commands typed most often pay nothing for it while their
daemon answers.
"""

from __future__ import annotations

import os
import time

from supervisor.wire.durations import parse_duration

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (some 3 ms a start)
if TYPE_CHECKING:
    from typing import Any

CONNECT_TIMEOUT_ENV = "GPUSV_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 60.0  # systemd's RestartSec (5 s) and a slow start, with room
FIRST_PAUSE_S = 0.1
LONGEST_PAUSE_S = 2.0
SYSTEM_SOCKET = "/run/gpusvd/gpusvd.sock"  # locations.SYSTEM_SOCKET, without pathlib
SYSTEM_UNIT = "gpusvd.service"
# Requests that make something new each time they are done, without a request id to
# tell a repeat: one that may have reached a daemon is never sent again.
ONCE_ONLY = frozenset({"restart", "restart_array"})


def connect_timeout(flag: str | None, env: dict[str, str] | os._Environ[str]) -> float:
    """--connect-timeout, else $GPUSV_CONNECT_TIMEOUT, else 60 s."""
    if flag is not None:
        return parse_duration(flag, "--connect-timeout")
    text = env.get(CONNECT_TIMEOUT_ENV)
    if text:
        return parse_duration(text, f"${CONNECT_TIMEOUT_ENV}")
    return DEFAULT_CONNECT_TIMEOUT_S


def may_send_again(request: dict[str, Any]) -> bool:
    """Whether a request that may already have been done can be sent again: reads and
    waits, cancels, holds and the like can; a submit only with its request id (then a
    repeat is answered with the first one's jobs); a restart of ended jobs cannot."""
    kind = request.get("type")
    if kind in ONCE_ONLY:
        return False
    if kind in ("submit", "submit_batch"):
        return bool(request.get("request_id") or request.get("dry_run"))
    return True


def pauses(first: float = FIRST_PAUSE_S, longest: float = LONGEST_PAUSE_S) -> list[float]:
    """The backoff between tries: doubling from `first` up to `longest` (then the last
    one repeats)."""
    out = [first]
    while out[-1] < longest:
        out.append(min(longest, out[-1] * 2))
    return out


def unit_activating(paths: list[str]) -> bool:
    """Whether systemd is starting gpusvd's unit now, for a client that would reach the
    system daemon: then its socket is on the way. False wherever systemd cannot say."""
    if SYSTEM_SOCKET not in paths or not os.path.isdir(os.path.dirname(SYSTEM_SOCKET)):
        return False
    import subprocess

    try:
        state = subprocess.run(
            ["systemctl", "is-active", SYSTEM_UNIT],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return state in ("activating", "reloading")


class Patience:
    """One request's wait for its daemon: started at its first failure, given up after
    the bound (and never past the call's own deadline, `health --timeout`)."""

    def __init__(self, bound_s: float, deadline: float | None, request: dict[str, Any]) -> None:
        self.bound_s = bound_s
        self.deadline = deadline
        self.since = time.monotonic()
        self.steps = pauses()
        self.tries = 0
        self.sent = False  # the request may have reached a daemon that went away
        self.wait_s = request.get("timeout_s") if request.get("type") == "wait" else None
        self.gap_seen = False

    def in_the_gap(self, sent: bool) -> bool:
        """No socket, for a client that saw one refuse (or lost its connection): the new
        daemon may be between removing the old socket and binding its own, a moment. One
        more look after a pause; no socket then, and the daemon was stopped."""
        if self.gap_seen or not (sent or self.tries):
            return False
        self.gap_seen = True
        return True

    def _end(self) -> float:
        end = self.since + self.bound_s
        return end if self.deadline is None else min(end, self.deadline)

    def pause(self) -> bool:
        """Sleep before the next try; False when the bound has passed."""
        left = self._end() - time.monotonic()
        if left <= 0:
            return False
        step = self.steps[min(self.tries, len(self.steps) - 1)]
        self.tries += 1
        time.sleep(min(step, left))
        return True

    def waited_s(self) -> float:
        return round(self._end() - self.since, 1)

    def again(self, request: dict[str, Any], spent_s: float) -> dict[str, Any]:
        """The request to send again: a `wait` keeps its own timeout from its first send."""
        if self.wait_s is None:
            return request
        return {**request, "timeout_s": max(0.0, float(self.wait_s) - spent_s)}


def gone_message(tried: list[str], bound_s: float, request: dict[str, Any]) -> str:
    text = f"gpusvd did not come back within {bound_s:g} s: tried {', '.join(tried)}"
    if request.get("type") in ("submit", "submit_batch") and request.get("request_id"):
        text += (
            f"; the submit may have been recorded: repeat it with --request-id "
            f"{request['request_id']} to be sure of one job"
        )
    return text


def not_again_message(request: dict[str, Any]) -> str:
    return (
        f"gpusvd closed the connection; the {request.get('type')} may have been done: "
        "check with `gpusv list` before repeating it"
    )
