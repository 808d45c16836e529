"""Who may do what: the identity rules shared by the request handlers and telemetry."""

from __future__ import annotations

import grp
import os
import pwd

from supervisor.core.jobs import Job
from supervisor.daemon.requests.server import Peer
from supervisor.wire import protocol
from supervisor.wire.protocol import ProtocolError


def forbidden(what: str) -> ProtocolError:
    return ProtocolError(protocol.FORBIDDEN, f"not allowed: {what}")


class Access:
    def __init__(self, admin_group: str | None) -> None:
        self.admin_group = admin_group

    def reconfigure(self, admin_group: str | None) -> None:
        self.admin_group = admin_group

    def is_admin(self, uid: int) -> bool:
        if uid == 0:
            return True
        if not self.admin_group:
            return False
        try:
            group = grp.getgrnam(self.admin_group)
            user = pwd.getpwuid(uid)
        except KeyError:
            return False
        return group.gr_gid in os.getgrouplist(user.pw_name, user.pw_gid)

    def admit(self, peer: Peer) -> str | None:
        """A non-root daemon can only run jobs as itself: it serves its own user (and
        admins, who may watch and cancel); a root daemon serves whoever reached the
        socket, which its mode and group already restrict."""
        me = os.geteuid()
        if me == 0 or peer.uid == me or self.is_admin(peer.uid):
            return None
        return f"this gpusvd runs as uid {me} and serves only that user"

    def may_act(self, peer: Peer, job: Job) -> bool:
        return peer.uid == job.spec.owner_uid or self.is_admin(peer.uid)

    def may_submit(self, peer: Peer) -> None:
        """A job runs as its submitter; a non-root daemon can only run jobs as itself, so
        there only its own user submits (admins of such a daemon watch and cancel)."""
        me = os.geteuid()
        if me != 0 and peer.uid != me:
            raise forbidden(f"this gpusvd runs as uid {me} and runs jobs only for that user")

    def may_see_uid(self, peer: Peer, uid: int) -> bool:
        return peer.uid == uid or self.is_admin(peer.uid)
