"""The protocol's error codes and the one exception every malformed request becomes."""

from __future__ import annotations

from typing import Any

# Error codes: stable strings that clients may branch on.
BAD_JSON = "bad_json"
BAD_REQUEST = "bad_request"
UNKNOWN_TYPE = "unknown_type"
TOO_LARGE = "too_large"
NOT_FOUND = "not_found"
FORBIDDEN = "forbidden"
BUSY = "busy"
LIMIT = "limit"
DRAINING = "draining"
INVALID_STATE = "invalid_state"
INTERNAL = "internal"
STORAGE = "storage"  # the daemon could not record the request (disk full, ...): nothing done


class ProtocolError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"ok": False, "error": {"code": self.code, "message": self.message}}
