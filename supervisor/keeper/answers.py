"""How the keeper answers a request: ok fields, or a typed error the caller can act on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reply = Callable[[dict[str, Any]], None]  # answers one request (ok fields or an error)


class Refused(Exception):
    """A request refused for a reason the caller can act on: (code, message); with
    `transient`, one that may go through if tried again (a fork's EAGAIN, a full disk)."""

    def __init__(self, code: str, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient

    def error(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": str(self)}
        if self.transient:
            out["transient"] = True
        return out


def spawn_error(message: str, is_transient: bool) -> dict[str, Any]:
    return Refused("spawn", message, transient=is_transient).error()
