"""The client side of the socket protocol: one connection, requests one at a time.

Used by the `gpusv` CLI, the bench and the tests. It imports time, _socket and the framing
(with jsonline, json's C codec) only: no typing, pathlib, contextlib or `re` at run time;
every command pays for its imports.
Given a `connect_timeout`, a call rides through a daemon restart: it waits for the next
daemon and sends the request again where that is safe (the policy: reconnect.py).
"""

from __future__ import annotations

import os

# The socket module's own class, without socket.py: that module builds four IntEnums of
# _socket's constants when imported, which cost `gpusv list` about 4 ms on a small VM
# (more than its own code). socket.socket is a thin subclass of this one; connect,
# sendall, recv and close are the C methods either way.
from _socket import AF_UNIX, SOCK_STREAM
from _socket import socket as Socket
from time import monotonic

from supervisor.wire import framing, jsonline

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from supervisor.client.reconnect import Patience

    SocketPath = str | os.PathLike[str]


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Unreachable(Exception):
    def __init__(self, message: str, *, maybe_sent: bool = False, waited: bool = False) -> None:
        super().__init__(message)
        self.maybe_sent = maybe_sent  # the daemon may have got (and done) the request
        self.waited = waited  # the client waited for a restarting daemon, in vain


class _Lost(Exception):
    """No answer: what each socket did, and whether the request may have reached one."""

    def __init__(
        self, tried: list[str], *, refused: bool = False, denied: bool = False, sent: bool = False
    ) -> None:
        super().__init__(", ".join(tried))
        self.tried, self.refused, self.denied, self.sent = tried, refused, denied, sent


def _down(lost: _Lost) -> str:
    tried = ", ".join(lost.tried)
    if lost.denied:
        return (
            f"cannot reach gpusvd: tried {tried}; ask to join the "
            "socket's group (socket_group in /etc/gpusvd.toml)"
        )
    return (
        f"gpusvd is not running: tried {tried}; start it with `gpusvd` "
        "or `systemctl start gpusvd`, or point GPUSV_SOCKET at its socket"
    )


class Client:
    """One connection for the whole command; requests go one at a time.

    Given several socket paths, it connects to the first that answers and, when none
    does, says what it tried and why each failed. With a `connect_timeout` over 0, a
    daemon that is restarting (its socket there but refusing) is waited for that long,
    and a request it may have got is sent again when a repeat cannot do it twice."""

    def __init__(
        self, path: SocketPath | Sequence[SocketPath], connect_timeout: float | None = 0.0
    ) -> None:
        self.paths: list[SocketPath] = [path] if isinstance(path, str | os.PathLike) else list(path)
        self.path = self.paths[0]
        self.sock: Socket | None = None
        self.buf = b""
        # How long to wait for a restarting daemon: 0 not at all (the library's default),
        # None as $GPUSV_CONNECT_TIMEOUT says (else 60 s), read only once needed.
        self.connect_timeout = connect_timeout
        self.answer_timeout: float | None = None  # the most one call may take, waits included
        # Sent first on every new connection after the first, answers unread: a `run`
        # client's submit, which ties its job to the new connection.
        self.replay: list[dict[str, Any]] = []
        self._deadline: float | None = None

    def _arm(self, sock: Socket) -> None:
        if self._deadline is not None:
            sock.settimeout(max(0.001, self._deadline - monotonic()))

    def _open(self) -> Socket:
        tried: list[str] = []
        refused = denied = False
        for path in self.paths:
            sock = Socket(AF_UNIX, SOCK_STREAM)
            self._arm(sock)
            try:
                sock.connect(os.fspath(path))
            except FileNotFoundError:
                sock.close()
                tried.append(f"{path} (no such socket)")
                continue
            except ConnectionRefusedError:
                sock.close()
                tried.append(f"{path} (refused)")
                refused = True
                continue
            except PermissionError:
                sock.close()
                tried.append(f"{path} (permission denied)")
                denied = True
                continue
            except BaseException:
                sock.close()
                raise
            # The daemon that answered is the one to wait for should it go away.
            self.paths, self.path = [path], path
            return sock
        raise _Lost(tried, refused=refused, denied=denied)

    def _connect(self) -> Socket:
        if self.sock is None:
            self.sock = self._open()
            for request in self.replay:
                self._exchange(dict(request))
        return self.sock

    def reset(self) -> None:
        """Drop the connection; the next call connects again."""
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def _exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        sock = self.sock
        assert sock is not None
        self._arm(sock)
        closed = _Lost([f"{self.path} (gpusvd closed the connection)"], sent=True)
        try:
            try:  # noqa: SIM105 (contextlib.suppress: an import the CLI does without)
                sock.sendall(framing.encode(request))
            except BrokenPipeError:
                pass  # refused (busy) and closed before it read: its answer is there to read
            while b"\n" not in self.buf:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise closed
                self.buf += chunk
        except (BrokenPipeError, ConnectionResetError):
            raise closed from None
        line, _, self.buf = self.buf.partition(b"\n")
        reply: dict[str, Any] = jsonline.decode(line)
        return reply

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        request.setdefault("version", framing.VERSION)
        started = monotonic()
        self._deadline = None if self.answer_timeout is None else started + self.answer_timeout
        patience: Patience | None = None
        try:
            while True:
                try:
                    self._connect()
                    reply = self._exchange(request)
                    break
                except _Lost as lost:
                    self.reset()
                    patience = self._wait(lost, request, patience)
                    request = patience.again(request, monotonic() - started)
        except TimeoutError:
            self.reset()
            raise Unreachable(
                f"gpusvd did not answer within {self.answer_timeout:g} s", waited=True
            ) from None
        finally:
            self._deadline = None
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise Refused(err.get("code", "error"), err.get("message", "request refused"))
        return reply

    def _wait(self, lost: _Lost, request: dict[str, Any], patience: Patience | None) -> Patience:
        """Wait before the next try (a restarting daemon), or say why there is none."""
        sent = lost.sent or (patience is not None and patience.sent)
        if self.connect_timeout is not None and self.connect_timeout <= 0:
            message = "gpusvd closed the connection" if lost.sent else _down(lost)
            raise Unreachable(message, maybe_sent=sent)  # not asked to wait: as it failed
        from supervisor.client import reconnect

        if self.connect_timeout is None:
            self.connect_timeout = reconnect.connect_timeout(None, os.environ)
        if lost.sent and not reconnect.may_send_again(request):
            raise Unreachable(reconnect.not_again_message(request), maybe_sent=True)
        if patience is None:
            patience = reconnect.Patience(self.connect_timeout, self._deadline, request)
        patience.sent = sent
        if lost.denied or not (
            lost.sent
            or lost.refused
            or patience.in_the_gap(sent)
            or reconnect.unit_activating([os.fspath(p) for p in self.paths])
        ):
            raise Unreachable(_down(lost), maybe_sent=sent, waited=sent or patience.tries > 0)
        if not patience.pause():
            message = reconnect.gone_message(lost.tried, patience.waited_s(), request)
            raise Unreachable(message, maybe_sent=sent, waited=True)
        return patience
