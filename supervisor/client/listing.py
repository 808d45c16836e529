"""`gpusv list`'s request: its filters, checked here so that a typo is a usage error
(exit 2) with a suggestion, not a refusal of the daemon's. Imported by the lean path
(quick.py) too: no argparse, no typing, no pathlib."""

from __future__ import annotations

import os

from supervisor.wire.sizes import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `list` starts sooner
if TYPE_CHECKING:
    import argparse
    from types import SimpleNamespace
    from typing import Any

    Args = argparse.Namespace | SimpleNamespace  # the parser's, or the lean path's (quick.py)

RECENT_S = 86400.0  # `list` without --all: active jobs and those ended this recently


def _owner(a: Args) -> int | None:
    if a.mine and a.user:
        raise ConfigError("give --user or --mine, not both")
    if a.mine:
        return os.getuid()
    if a.user is None:
        return None
    if a.user.isdigit():
        return int(a.user)
    import pwd

    try:
        return pwd.getpwnam(a.user).pw_uid
    except KeyError:
        raise ConfigError(f"--user: no user {a.user!r}") from None


STATES = ("queued", "running", "succeeded", "failed", "cancelled")


def list_states(text: str | None) -> list[str]:
    """--state's value as a list, each one a state the daemon knows (a typo is a usage
    error here, said with the closest state, not a refusal of the daemon's)."""
    states = [s.strip() for s in (text or "").split(",") if s.strip()]
    for state in states:
        if state not in STATES:
            from supervisor.client.usage import did_you_mean

            raise ConfigError(
                f"--state: unknown state {state!r}{did_you_mean(state, STATES)}; "
                f"the states are {', '.join(STATES)}"
            )
    return states


def label_filter(items: list[str] | None) -> dict[str, str]:
    """--label K=V (repeatable): a job must carry every one."""
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--label: expected K=V, got {item!r}")
        labels[key] = value
    return labels


def list_request(a: Args) -> dict[str, Any]:
    request: dict[str, Any] = {"type": "list", "limit": a.limit}
    states = list_states(a.state)
    if states:
        request["states"] = states
    owner = _owner(a)
    if owner is not None:
        request["owner_uid"] = owner
    if getattr(a, "name", None) is not None:
        request["name"] = a.name
    labels = label_filter(getattr(a, "label", None))
    if labels:
        request["labels"] = labels
    if a.array is not None:
        request["array"] = a.array
    elif not a.all and not states:
        request["recent_s"] = RECENT_S
    return request
