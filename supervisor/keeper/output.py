"""Jobs' output, relayed: a job's stdout and stderr are pipes that the keeper reads and
copies into the job's files, recording the order in which the two were written.

Why a relay and not the files themselves: a job writing its own file on a full disk
gets ENOSPC (most programs then exit 1, their log cut mid-line); a job writing into a
pipe never does. The keeper reads every pipe whatever happens to the files: what the
disk refuses is dropped and counted (`dropped`, reported with the attempt's exit), and
the job runs on. And the order of the two streams is kept: `gpusv logs` interleaves
them as they were written.

The order is an index beside the files (`ID.idx`), fixed-size records appended:
`(kind, length, end)`. A record of a stream closes a *run*: the bytes of that stream's
file up to `end` (its offset after the run's last write) came before whatever is
recorded after it. A run is closed when the other stream is written, and when the
attempt ends: one record per switch of streams, none per chunk, so a job that writes
one stream only costs one record. The bytes of the run still open are the files' tails
(a reader takes the sizes before it reads the index, so at most one file has a tail the
relay wrote). The daemon adds the header between two attempts (both files, recorded
first) and the cuts of the size cap. Per read the relay does a read and a write, in
blocks of up to READ_SIZE: no per-line work.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from .spawn import Spec

RECORD = struct.Struct("<BxxxIQ")  # kind, length, end (the kind's file offset after it)
STDOUT, STDERR = 1, 2  # a run of that stream ends at `end`; `length`: its bytes (for tools)
HEADER_OUT, HEADER_ERR = 3, 4  # the daemon's header between attempts: `length` bytes to `end`
CUT_OUT, CUT_ERR = 5, 6  # the size cap removed `length` bytes at `end` (the kept head's end)
READ_SIZE = 256 * 1024
_SEEK_CUR = os.SEEK_CUR


def index_path(stdout_path: str) -> str:
    """`ID.idx` beside `ID.out`."""
    stem, dot, _ = stdout_path.rpartition(".")
    return f"{stem}.idx" if dot else f"{stdout_path}.idx"


def open_private(path: str, uid: int | None, gid: int | None) -> int:
    """A file of the job's, appended to, private to its user: output may echo secrets."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o7777 != 0o600:
            os.fchmod(fd, 0o600)
        if uid is not None and os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid if gid is not None else -1)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass
class Sink:
    """The pipes of one spawn: the job writes into `out_w`/`err_w` (one pipe for both
    when both streams go to one file, as 2>&1 would), the keeper reads the read ends."""

    out_r: int
    out_w: int
    err_r: int
    err_w: int

    def close_job_ends(self) -> None:
        """Once the job holds them: the keeper keeps none, or it would never see EOF."""
        for fd in {self.out_w, self.err_w}:
            os.close(fd)


@dataclass
class Output:
    """One attempt's output: where it goes, and what the relay knows of it."""

    key: tuple[int, int]
    paths: tuple[str, str]  # stdout's and stderr's files (may be one path)
    index: str | None  # None: an attempt whose order is not recorded
    uid: int | None
    gid: int | None
    open_pipes: dict[int, int] = field(default_factory=dict)  # read end -> stream
    files: dict[int, int] = field(default_factory=dict)  # stream -> fd, opened at first byte
    index_fd: int = -1
    pending: bytearray = field(default_factory=bytearray)  # index records not yet written
    current: int = 0  # the stream of the run still open (0: none)
    run: int = 0  # bytes written in the open run
    dropped: int = 0  # bytes read from the job that no file took
    failed: str = ""  # why the last write failed ("" once one went through again)
    exited: bool = False  # its exit is recorded (with `dropped` as it was then)


def output_of(spec: Spec) -> Output:
    key, paths = (spec.job, spec.attempt), (spec.stdout, spec.stderr)
    return Output(key, paths, spec.index, spec.uid, spec.gid)


class Relay:
    """Every job's output, in the keeper's one loop: read ends registered on its selector."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.sel: selectors.BaseSelector | None = None  # set by the server that runs the loop
        self.outputs: dict[tuple[int, int], Output] = {}
        self.write = os.write  # into a job's file: a seam for a disk that refuses

    @staticmethod
    def sink(same: bool) -> Sink:
        """New pipes for a spawn (close-on-exec, read ends non-blocking)."""
        out_r, out_w = os.pipe()
        os.set_blocking(out_r, False)
        if same:
            return Sink(out_r, out_w, out_r, out_w)
        try:
            err_r, err_w = os.pipe()
        except BaseException:
            os.close(out_r)
            os.close(out_w)
            raise
        os.set_blocking(err_r, False)
        return Sink(out_r, out_w, err_r, err_w)

    @staticmethod
    def abandon(sink: Sink) -> None:
        for fd in {sink.out_r, sink.out_w, sink.err_r, sink.err_w}:
            os.close(fd)

    def start(self, output: Output, sink: Sink) -> None:
        """The job holds the write ends now: relay what comes on the read ends."""
        sink.close_job_ends()
        output.open_pipes[sink.out_r] = STDOUT
        if sink.err_r != sink.out_r:
            output.open_pipes[sink.err_r] = STDERR
        self.outputs[output.key] = output
        # Each file at its first byte: a job that writes nothing costs no file (creating
        # one is the keeper's dearest step on a file system that has just deleted many),
        # and the ids handed out are marked by the store, not by the logs (store/guard.py).
        if self.sel is not None:
            for fd in output.open_pipes:
                self.sel.register(fd, selectors.EVENT_READ, lambda fd=fd: self.readable(output, fd))

    def readable(self, output: Output, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        if data:
            self._write(output, output.open_pipes[fd], data)
        else:
            self._closed(output, fd)

    def ended(self, key: tuple[int, int]) -> int:
        """The attempt's leader is gone: take what its pipes hold now, close the open run
        (a header or a reader may come next), and say how many bytes were dropped so
        far. Pipes still held by what the job left running are relayed on."""
        output = self.outputs.get(key)
        if output is None:
            return 0
        for fd in list(output.open_pipes):
            for _ in range(64):  # at most 16 MiB here: a flood is read on by the loop
                if fd not in output.open_pipes:
                    break
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    break
                if not data:
                    self._closed(output, fd)
                    break
                self._write(output, output.open_pipes[fd], data)
        self._close_run(output)
        output.exited = True
        if not output.open_pipes:
            self.outputs.pop(key, None)
        return output.dropped

    # -- files ------------------------------------------------------------------------

    def _write(self, output: Output, stream: int, data: bytes) -> None:
        if output.current != stream:
            self._close_run(output)
            output.current = stream
        view, fd = memoryview(data), -1
        try:
            fd = self._file(output, stream)
            if output.failed:  # the disk took a write again: say where bytes are missing
                self.write(fd, _gap(output.dropped))
                output.failed = ""
            while view:
                done = self.write(fd, view)
                output.run += done
                view = view[done:]
        except OSError as exc:  # said once a spell: the disk may refuse every read's bytes
            output.dropped += len(view)
            if not output.failed:
                output.failed = exc.strerror or str(exc)
                job, attempt = output.key
                self.log(f"job {job} attempt {attempt}: output dropped: {output.failed}")

    def _file(self, output: Output, stream: int) -> int:
        fd = output.files.get(stream)
        if fd is None:
            path = output.paths[stream - 1]
            other = output.files.get(STDERR if stream == STDOUT else STDOUT)
            if other is not None and output.paths[0] == output.paths[1]:
                fd = other
            else:
                fd = open_private(path, output.uid, output.gid)
            output.files[stream] = fd
        return fd

    def _close_run(self, output: Output) -> None:
        """Record where the open run ends; records the disk refused wait in memory and go
        with the next one (their order is all that matters)."""
        stream, output.current, run = output.current, 0, output.run
        output.run = 0
        fd = output.files.get(stream)
        if fd is None or output.index is None:
            return
        try:
            end = os.lseek(fd, 0, _SEEK_CUR)
        except OSError:
            return
        output.pending += RECORD.pack(stream, min(run, 0xFFFFFFFF), end)
        try:
            if output.index_fd < 0:
                output.index_fd = open_private(output.index, output.uid, output.gid)
            written = os.write(output.index_fd, output.pending)
            torn = written % RECORD.size
            if torn:  # a full disk took part of a record: cut it, or every later one shifts
                os.ftruncate(output.index_fd, os.lseek(output.index_fd, 0, os.SEEK_END) - torn)
            del output.pending[: written - torn]
        except OSError:
            pass

    def _closed(self, output: Output, fd: int) -> None:
        """EOF: every holder of this pipe's write end is gone."""
        if self.sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
        del output.open_pipes[fd]
        os.close(fd)
        if not output.open_pipes:
            self._close_run(output)
            for f in set(output.files.values()) | ({output.index_fd} - {-1}):
                os.close(f)
            output.files.clear()
            output.index_fd = -1
            if output.exited:  # else kept until its exit takes `dropped`
                self.outputs.pop(output.key, None)


def _gap(dropped: int) -> bytes:
    return f"\n[gpusv: output dropped here ({dropped} bytes so far): {_WHY}]\n".encode()


_WHY = "the disk refused it"
