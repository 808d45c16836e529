"""`gpusv run`: submit a job tied to this terminal, stream its output, exit with its status.

The job is submitted with `"run": true`: the daemon cancels it when this connection goes
away, so a killed client (or the batch job wrapping it) does not leave it running.
Ctrl-C and SIGTERM cancel it at once and exit 128 + the signal. When the daemon restarts,
the client waits for the next one, sends its submit again (the same request id: the same
job, tied to the new connection) and reads on from the offsets it had reached.
"""

from __future__ import annotations

import os
import sys

from supervisor.client.connection import Client
from supervisor.client.submitting import command_of, exit_status, job_options
from supervisor.wire.sizes import ConfigError

# No typing, and _signal rather than signal.py (which builds three IntEnums when
# imported), at run time: `run` starts as soon as `submit` does.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse
    import signal
    from types import FrameType
    from typing import Any, BinaryIO
else:
    import _signal as signal


POLL_S = 0.1


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signum)


def _pump(client: Client, job_id: int, stream: str, offset: int, out: BinaryIO) -> tuple[int, bool]:
    """Copy what the log has past `offset`; the new offset and whether the job ended
    with all of this stream read."""
    # binascii's decoder is what base64.b64decode calls; base64 itself imports re and struct.
    from binascii import a2b_base64

    request = {"type": "logs", "ids": [job_id], "stream": stream, "offset": offset}
    reply = client.call(request)
    data = a2b_base64(reply["data_b64"])
    if data:
        out.write(data)
        out.flush()
    return reply["offset"], bool(reply["done"])


def _stream(client: Client, job_id: int) -> None:
    """Copy both streams until the job has ended and both are read."""
    offsets = {"stdout": 0, "stderr": 0}
    outs = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
    moved = False
    while True:
        if not moved:
            # Not a sleep: the daemon answers the moment the job ends, so a short job
            # is read once, when it has ended, and its end reaches the terminal as soon
            # as `submit --wait` would see it. Output that comes in the meantime waits
            # at most POLL_S.
            client.call({"type": "wait", "ids": [job_id], "timeout_s": POLL_S})
        moved, done = False, True
        for stream in offsets:
            before = offsets[stream]
            offsets[stream], finished = _pump(client, job_id, stream, before, outs[stream])
            moved |= offsets[stream] != before
            done &= finished
        if done:
            return


def cmd_run(client: Client, a: argparse.Namespace) -> int:
    command = command_of(a)
    if not command:
        raise ConfigError("run needs a command after --")
    request: dict[str, Any] = {"type": "submit", "argv": command, "run": True, **job_options(a)}
    # Sent again to a restarted daemon, the submit makes no second job (its request id)
    # and ties the job to the new connection, so that Ctrl-C still cancels it.
    request["request_id"] = os.urandom(16).hex()
    previous = signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)
    job_id = None
    try:
        submitted = client.call(request)
        for line in submitted.get("warnings") or ():  # queued all the same
            sys.stderr.write(f"gpusv: warning: {line}\n")
        job_id = int(submitted["ids"][0])
        client.replay = [request]
        _stream(client, job_id)
        job = client.call({"type": "show", "ids": [job_id]})["job"]
        if str(job.get("reason") or "").startswith("spawn_"):
            from supervisor.client.render import failure_text

            sys.stderr.write(f"gpusv: job {job_id} could not start: {failure_text(job)}\n")
        return exit_status(job)
    except _Stopped as stop:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cancel
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if job_id is not None:  # a new connection: the signal may have cut a reply short
            sys.stderr.write(f"gpusv: cancelling job {job_id}\n")
            Client(client.path, client.connect_timeout).call({"type": "cancel", "ids": [job_id]})
        return 128 + stop.signum
    finally:
        signal.signal(signal.SIGTERM, previous)
