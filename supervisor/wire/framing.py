"""Framing of the socket protocol: newline-delimited JSON, one object a line.

Split from protocol.py (requests and their validation) so that a client that only frames
requests does not pay for importing the validation.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the CLI imports this
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
MAX_LINE = 1024 * 1024  # one request line; longer ones are refused unread


def encode(obj: dict[str, Any]) -> bytes:
    # backslashreplace: a lone surrogate (an undecodable file name in a CLI's argv) goes out
    # as its JSON escape, which the daemon refuses with a typed error, instead of raising.
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace") + b"\n"
