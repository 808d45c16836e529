"""The OOM ranking carried out: oom_score_adj written to /proc, for jobs and the daemon.

The ranking itself (who dies first) is pure, in core/oom.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping

from supervisor.core.oom import BASE, NEWEST, base_value

__all__ = ["NEWEST", "apply", "daemon_self_adjust", "preexec_oom_score_adj", "read_value"]

DAEMON = -900
_SELF = "/proc/self/oom_score_adj"


def preexec_oom_score_adj(value: int) -> Callable[[], None]:
    """A subprocess preexec hook that sets the child's value before exec; it is inherited.

    Run it before any change of uid: after setuid the process is not dumpable, its
    /proc/self files belong to root, and the write fails. subprocess.Popen(user=...)
    changes the uid before preexec_fn, so a job that runs as another user needs the uid
    change done in the same hook, after this one. Raises if the value cannot be set:
    a job left at the daemon's own low value would be the last one the kernel kills.
    """
    data = str(value).encode()

    def set_value() -> None:
        fd = os.open(_SELF, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    return set_value


def apply(adjustments: Mapping[int, int]) -> list[str]:
    """Write each pid's value; processes that are gone are skipped. Returns the failures."""
    failures: list[str] = []
    for pid, value in sorted(adjustments.items()):
        try:
            _write(f"/proc/{pid}/oom_score_adj", value)
        except (ProcessLookupError, FileNotFoundError):
            continue
        except OSError as exc:
            failures.append(f"pid {pid}: cannot set oom_score_adj {value}: {exc.strerror}")
    return failures


def read_value(pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/oom_score_adj") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def daemon_self_adjust(target: int = DAEMON) -> str | None:
    """Lower the daemon's own value so that it outlives every job; a note if it cannot.

    Lowering needs CAP_SYS_RESOURCE (root usually has it; systemd's OOMScoreAdjust= does
    the same from outside). A daemon that a user runs has neither: that is the normal
    case, and the note says so. The daemon then stays where it is and older jobs are set
    to base_value(own) instead of 0; the newest-first order holds either way.
    """
    current = read_value()
    if current is not None and current <= target:
        return None
    try:
        _write(_SELF, target)
        return None
    except OSError as exc:
        own = current if current is not None else BASE
        denied = exc.errno in (errno.EPERM, errno.EACCES)
        why = "" if denied else f" ({exc.strerror})"
        older = "" if base_value(own) == BASE else f"; older jobs get no value below {own}"
        return (
            f"oom_score_adj: the daemon stays at {own}{why}, not {target}, as a daemon "
            f"without CAP_SYS_RESOURCE does (systemd's OOMScoreAdjust= or root lowers "
            f"it){older}; jobs are still killed newest first"
        )


def _write(path: str, value: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)
