"""A job's two output files read as one stream, in the order they were written.

The keeper's relay records that order in `ID.idx` (supervisor/keeper/output.py): each
record closes a run of one stream at an offset of its file. `pieces` turns the index
and the files' sizes into the merged stream, a list of (stream, start, end) ranges of
the two files; `read` serves a chunk of it from a position, `tail_position` finds where
its last N lines begin. A position counts the bytes of the merged stream, the bytes the
size cap cut out included (they read as nothing), so that a reader following a job keeps
its place across a cut. A file with no index (an attempt from before the relay) reads as
its stdout, then its stderr.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from supervisor.keeper.output import (
    CUT_ERR,
    CUT_OUT,
    HEADER_ERR,
    HEADER_OUT,
    RECORD,
    STDERR,
    STDOUT,
)

OUT, ERR = "stdout", "stderr"
GPUSV = "gpusv"  # the daemon's own lines between attempts
_STREAM = {STDOUT: OUT, STDERR: ERR, HEADER_OUT: OUT, HEADER_ERR: ERR, CUT_OUT: OUT, CUT_ERR: ERR}


@dataclass(frozen=True)
class Piece:
    """Bytes [start, end) of one stream's file, in uncut coordinates; `label` is the
    stream the reader is told (GPUSV for a header between attempts)."""

    file: str  # OUT or ERR: which file
    start: int
    end: int
    label: str

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Layout:
    pieces: tuple[Piece, ...]
    holes: dict[str, tuple[tuple[int, int], ...]]  # per file: uncut ranges the cap removed

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)


def records(index: bytes) -> list[tuple[int, int, int]]:
    whole = len(index) - len(index) % RECORD.size
    return [RECORD.unpack_from(index, i) for i in range(0, whole, RECORD.size)]


def layout(index: bytes, sizes: dict[str, int]) -> Layout:
    """The merged stream of files of these (current) sizes. Pure.

    Offsets in a record are the file's as it was when the record was written; the cuts
    recorded before it shift them back to uncut coordinates. A record past its file's
    end (a header recorded before it is written) ends the layout there: what follows
    it is not known yet, and a reader must not take it for something else."""
    shift = {OUT: 0, ERR: 0}
    holes: dict[str, list[tuple[int, int]]] = {OUT: [], ERR: []}
    upto = {OUT: 0, ERR: 0}
    pieces: list[Piece] = []

    def take(file: str, end: int, label: str) -> None:
        if end > upto[file]:
            pieces.append(Piece(file, upto[file], end, label))
            upto[file] = end

    recs = records(index)
    cut = {OUT: 0, ERR: 0}  # by the end of the index: the files' sizes are of now
    for kind, length, _ in recs:
        if kind in (CUT_OUT, CUT_ERR):
            cut[_STREAM[kind]] += length
    for i, (kind, length, end) in enumerate(recs):
        file = _STREAM.get(kind)
        if file is None:
            continue  # a kind this reader does not know: a later writer's
        if kind in (CUT_OUT, CUT_ERR):
            holes[file].append((end + shift[file], end + shift[file] + length))
            shift[file] += length
            continue
        end += shift[file]
        if end > sizes[file] + cut[file]:
            return Layout(tuple(pieces), {k: tuple(v) for k, v in holes.items()})
        if kind in (STDOUT, STDERR):
            take(file, end, file)
        elif kind == HEADER_OUT:  # its copy in stderr's file follows: shown once
            take(OUT, end - length, OUT)
            nxt = recs[i + 1] if i + 1 < len(recs) else None
            if nxt is not None and nxt[0] == HEADER_ERR:
                err_end = nxt[2] + shift[ERR]
                if err_end > sizes[ERR] + cut[ERR]:  # its copy not written yet: wait
                    return Layout(tuple(pieces), {k: tuple(v) for k, v in holes.items()})
                take(ERR, err_end - nxt[1], ERR)
            take(OUT, end, GPUSV)
        else:  # HEADER_ERR: the copy of the header just shown, skipped
            take(ERR, end - length, ERR)
            upto[ERR] = max(upto[ERR], end)
    for file in (OUT, ERR):  # the open run (and files with no index at all)
        take(file, sizes[file] + cut[file], file)
    return Layout(tuple(pieces), {k: tuple(v) for k, v in holes.items()})


def current(offset: int, holes: tuple[tuple[int, int], ...]) -> int:
    """Where an uncut offset outside the holes is in the file now."""
    return offset - sum(h_end - h_start for h_start, h_end in holes if h_end <= offset)


def _forward(holes: tuple[tuple[int, int], ...], start: int, end: int) -> tuple[int, int, int]:
    """From uncut `start`: (first byte to read, end of the hole-free run, where the next
    read starts). A start inside a hole skips to its end (those bytes read as nothing)."""
    for h_start, h_end in holes:
        if h_start <= start < h_end:
            return start, start, min(h_end, end)
        if start < h_start < end:
            end = h_start
    return start, end, end


def _backward(holes: tuple[tuple[int, int], ...], start: int, end: int) -> tuple[int, int]:
    """The hole-free run that ends at uncut `end`, no earlier than `start`: (run start,
    where the next read back ends)."""
    for h_start, h_end in holes:
        if h_start < end <= h_end:
            return end, max(start, h_start)
        if start < h_end < end:
            start = h_end
    return start, start


def _pread(fd: int, holes: tuple[tuple[int, int], ...], start: int, end: int) -> bytes:
    if end <= start or fd < 0:
        return b""
    return os.pread(fd, end - start, current(start, holes))


Segment = tuple[str, bytes]


def read(lay: Layout, fds: dict[str, int], position: int, limit: int) -> tuple[list[Segment], int]:
    """Up to `limit` bytes of the merged stream from `position`: its segments (label,
    bytes; neighbours of one label joined) and the position after them."""
    out: list[Segment] = []
    at, budget = 0, limit
    for piece in lay.pieces:
        if budget <= 0:
            break
        if position >= at + piece.size:
            at += piece.size
            continue
        holes = lay.holes[piece.file]
        offset = piece.start + (position - at)
        while offset < piece.end and budget > 0:
            first, stop, nxt = _forward(holes, offset, min(piece.end, offset + budget))
            data = _pread(fds[piece.file], holes, first, stop)
            if data:
                if out and out[-1][0] == piece.label:
                    out[-1] = (piece.label, out[-1][1] + data)
                else:
                    out.append((piece.label, data))
            if len(data) < stop - first:  # the file is shorter than its layout said
                offset, budget = first + len(data), 0
                break
            budget -= nxt - offset
            offset = nxt
        position = at + (offset - piece.start)
        at += piece.size
    return out, position


def tail_position(lay: Layout, fds: dict[str, int], lines: int, block: int = 64 * 1024) -> int:
    """Where the last `lines` lines of the merged stream begin (a final newline ends a
    line, it starts none)."""
    total = lay.size
    if lines <= 0:
        return total
    seen, at, first = 0, total, True
    for piece in reversed(lay.pieces):
        at -= piece.size
        holes, end = lay.holes[piece.file], piece.end
        while end > piece.start:
            start, nxt = _backward(holes, max(piece.start, end - block), end)
            data = _pread(fds[piece.file], holes, start, end)
            if first and data:
                first = False
                if data.endswith(b"\n"):
                    data = data[:-1]
            i = len(data)
            while (i := data.rfind(b"\n", 0, i)) >= 0:
                seen += 1
                if seen == lines:
                    return at + (start + i + 1 - piece.start)
            end = nxt
    return 0


def open_files(paths: dict[str, Path]) -> tuple[dict[str, int], dict[str, int]]:
    """Descriptors and sizes of both files (a missing file: size 0), the sizes taken
    before the index is read (see output.py: then at most one file has a tail the relay
    has not recorded yet)."""
    fds, sizes = {}, {}
    for name, path in paths.items():
        try:
            fds[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            sizes[name] = os.fstat(fds[name]).st_size
        except FileNotFoundError:
            fds[name] = -1
            sizes[name] = 0
    return fds, sizes
