"""Framing of the socket protocol: newline-delimited JSON, one object a line.

Split from protocol.py (requests and their validation) so that a client that only frames
requests does not pay for importing the validation. The same encoding and limits serve
every hop: a client to gpusvd, and gpusvd to its keepers (supervisor.keeper imports
this module, which needs only the standard library). It encodes with jsonline (`json`'s C
codec without `json`'s `re`), which the CLI also decodes its answers with.
"""

from __future__ import annotations

from supervisor.wire import jsonline

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the CLI imports this
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
MAX_LINE = 1024 * 1024  # one request line; longer ones are refused unread
# A spawn line to a keeper carries a request's own fields, encoded the same way, and what
# gpusvd adds (ids, paths, a few environment variables): a request under MAX_LINE always
# fits in this, and one that does not is refused by gpusvd before it is sent.
MAX_KEEPER_LINE = MAX_LINE + 64 * 1024


def encode(obj: dict[str, Any]) -> bytes:
    # backslashreplace: a lone surrogate (an undecodable file name in a CLI's argv) goes out
    # as its JSON escape, which the daemon refuses with a typed error, instead of raising.
    return jsonline.encode(obj).encode("utf-8", "backslashreplace") + b"\n"
