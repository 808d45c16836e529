"""How `gpusv logs` prints a job's output: both streams in the order they were written.

Text: the bytes as the job wrote them, each stderr line marked, since once the two are
in one stream nothing else tells them apart: in red on a terminal (a `[stderr] ` prefix
where NO_COLOR is set or TERM is dumb), with the prefix in a file or a pipe. `--json`:
one object a line, `{"stream": "stdout"|"stderr"|"gpusv", "line": str}` ("gpusv": the
line between two attempts), a line without its newline, as UTF-8 with undecodable
bytes replaced.
"""

from __future__ import annotations

import json
from typing import BinaryIO

PREFIX = b"[stderr] "
RED, RESET = b"\x1b[31m", b"\x1b[0m"


def marking(isatty: bool, env: dict[str, str]) -> str:
    """How stderr lines are marked: "color", "prefix" or "none" (one stream alone)."""
    if isatty and "NO_COLOR" not in env and env.get("TERM", "") not in ("", "dumb"):
        return "color"
    return "prefix"


class View:
    def __init__(self, out: BinaryIO, *, as_json: bool, mark: str) -> None:
        self.out = out
        self.as_json = as_json
        self.mark = mark
        self.partial: dict[str, bytes] = {}  # --json: a line not ended yet, per stream
        self.line_start = True  # text: the next stderr byte begins a line

    def write(self, stream: str, data: bytes) -> None:
        if not data:
            return
        if self.as_json:
            self._json(stream, data)
        elif stream == "stderr" and self.mark != "none":
            self.out.write(self._marked(data))
        else:
            self.out.write(data)
            if self.mark != "none":  # a stdout line ends where stderr's next one starts
                self.line_start = True
        self.out.flush()

    def close(self) -> None:
        """The end: lines that never got their newline are printed as they are."""
        for stream, rest in self.partial.items():
            if rest:
                self._line(stream, rest)
        self.partial.clear()
        self.out.flush()

    def _marked(self, data: bytes) -> bytes:
        lines = data.split(b"\n")
        out = bytearray()
        for i, piece in enumerate(lines):
            last = i == len(lines) - 1
            if self.mark == "color":
                out += RED + piece + RESET if piece else b""
            elif self.line_start and (piece or not last):
                out += PREFIX + piece
            else:
                out += piece
            if not last:
                out += b"\n"
                self.line_start = True
            elif piece:
                self.line_start = False
        return bytes(out)

    def _json(self, stream: str, data: bytes) -> None:
        lines = (self.partial.pop(stream, b"") + data).split(b"\n")
        self.partial[stream] = lines.pop()
        for line in lines:
            if stream == "gpusv" and not line:
                continue  # the blank line that sets a header apart, in text only
            self._line(stream, line)

    def _line(self, stream: str, line: bytes) -> None:
        obj = {"stream": stream, "line": line.decode("utf-8", "replace")}
        self.out.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
