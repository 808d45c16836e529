"""JSON for the socket protocol with the standard library's C codec (`_json`) alone.

`json`'s own Python modules import `re` (json.encoder and json.scanner compile patterns at
import), and `re` imports `enum`: together about 5 ms of a CLI command's start, more than
the command's own code. The C codec is what `json` itself runs for a compact one-shot
encode and for every decode; this module calls it as `json` does, so that the bytes and
the objects are the same: `encode` is `json.dumps(obj, separators=(",", ":"),
ensure_ascii=False)` and `decode` is `json.loads` of a UTF-8 line (tests/wire holds both
to `json`'s). Only an error imports `json` (the C scanner raises `json.JSONDecodeError`).
`dumps` is `json.dumps(obj)` with its defaults, for the text gpusvd stores in SQLite.
"""

from __future__ import annotations

from _json import encode_basestring, encode_basestring_ascii
from _json import make_encoder as _make_encoder
from _json import make_scanner as _make_scanner

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the CLI imports this
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"  # JSON's whitespace, which str.strip() would widen


def _default(obj: object) -> Any:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def encode(obj: object) -> str:
    """Compact JSON text of `obj`, non-ASCII characters as they are."""
    # A fresh circular-reference memo each time, as json.JSONEncoder.iterencode makes: the
    # C encoder leaves its entries behind when it raises part-way.
    chunks = _make_encoder({}, _default, encode_basestring, None, ":", ",", False, False, True)(
        obj, 0
    )
    return "".join(chunks)


# json.dumps(obj) with its defaults, made once: no circular-reference memo, which the
# plain rows and events passed here cannot need and which an encoder kept for reuse must
# not carry from a call that raised.
_stored = _make_encoder(
    None, _default, encode_basestring_ascii, None, ": ", ", ", False, False, True
)


def dumps(obj: object) -> str:
    """`json.dumps(obj)` exactly (`", "` and `": "`, ASCII only), without the Python
    layers json.dumps builds at each call: for the text stored in SQLite, a few a job
    (its spec, its cards, its events' data), and the same bytes as before."""
    return "".join(_stored(obj, 0))


class _Context:
    """The decoder settings the C scanner reads: json.JSONDecoder()'s defaults."""

    def __init__(self) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = None
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = _CONSTANTS.__getitem__


_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
# typeshed types the context as a scanner; the C code reads only the attributes above.
_scan = _make_scanner(_Context())  # type: ignore[arg-type]


def decode(line: bytes | str) -> Any:
    """The value of one JSON document (a line as read from a socket, UTF-8)."""
    text = line.decode("utf-8", "surrogatepass") if isinstance(line, bytes) else line
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration as err:
        raise _error("Expecting value", text, err.value) from None
    rest = text[end:]
    if rest.lstrip(_WHITESPACE):
        raise _error("Extra data", text, end + len(rest) - len(rest.lstrip(_WHITESPACE)))
    return obj


def _error(message: str, text: str, at: int) -> ValueError:
    from json import JSONDecodeError

    return JSONDecodeError(message, text, at)
