"""The kernel log as a followed file (`kernel_log = "file:PATH"`), as `tail -F` would."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator
from typing import BinaryIO

import anyio

from supervisor.faults.records import KernelLine, Resume

FILE_POLL_S = 0.2


class FileFollower:
    """`tail -F` by polling: starts at the end of an existing file (or where `resume` says
    the last follower stopped), reads a file that appears later from its start, rereads a
    truncated file, and switches to a rotated-in file."""

    def __init__(self, path: str, resume: Resume | None = None) -> None:
        self.path = path
        self.resume = resume if resume is not None else Resume()
        self._file: BinaryIO | None = None
        self._ident: tuple[int, int] = (0, 0)
        self._partial = b""
        self._at_start = True  # only a file present at start is skipped to its end

    def poll(self) -> list[str]:
        """Complete lines that arrived since the last call."""
        if self._file is None and not self._open():
            return []
        lines = self._read()
        if self._replaced():
            if self._partial:
                lines.append(self._partial.decode("utf-8", "replace"))
            self.close()
            if self._open():
                lines += self._read()
        return [line for line in lines if line.strip()]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._partial = b""

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            self._at_start = False
            return False
        st = os.fstat(f.fileno())
        ident = (st.st_dev, st.st_ino)
        saved = self.resume.file_offset
        if saved is not None and saved[0] == ident and saved[1] <= st.st_size:
            f.seek(saved[1])  # the same file as before a restart: on from where it stopped
        elif self._at_start and saved is None:
            f.seek(0, os.SEEK_END)
        self._at_start = False
        self._file, self._ident = f, ident
        return True

    def _read(self) -> list[str]:
        assert self._file is not None
        if os.fstat(self._file.fileno()).st_size < self._file.tell():  # truncated
            self._file.seek(0)
            self._partial = b""
        data = self._file.read()
        if not data:
            return []
        *complete, self._partial = (self._partial + data).split(b"\n")
        # A line cut short is read again whole after a restart.
        self.resume.file_offset = (self._ident, self._file.tell() - len(self._partial))
        return [c.rstrip(b"\r").decode("utf-8", "replace") for c in complete]

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # gone for now: keep the old handle until a new file appears
        return (st.st_dev, st.st_ino) != self._ident


async def file_lines(
    path: str, *, poll_s: float = FILE_POLL_S, resume: Resume | None = None
) -> AsyncGenerator[KernelLine, None]:
    follower = FileFollower(path, resume)
    try:
        while True:
            for text in follower.poll():
                yield KernelLine(text, time.time())
            await anyio.sleep(poll_s)
    finally:
        follower.close()
