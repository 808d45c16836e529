"""Runs gpusvd under a real systemd-journald of its own, as a unit's stdout would be.

Started by test_journal_fields.py as `unshare --mount --propagation private python3 THIS
ROOT ARGV...`: in that private mount namespace, a tmpfs over /run and ROOT/journal-files
over /var/log (the host's journal, if any, is never seen nor touched), a journald of the
namespace `gpusvtest` whose directory is bind-mounted where the daemon looks
(/run/systemd/journal), and the daemon run by systemd-cat with
$JOURNAL_STREAM set to its stream's device:inode, as systemd does for a service
(systemd.exec(5)). SIGTERM stops the daemon, then journald. Each child dies with this
process.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from pathlib import Path

NAMESPACE = "gpusvtest"
JOURNALD = "/lib/systemd/systemd-journald"
PR_SET_PDEATHSIG = 1
SHIM = 'export JOURNAL_STREAM="$(stat -L -c %d:%i /proc/self/fd/2)"; exec "$@"'


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True)


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"journald did not make {path} (exit {proc.poll()})")
        time.sleep(0.02)


def main(root: Path, argv: list[str]) -> int:
    _run("mount", "-t", "tmpfs", "tmpfs", "/run")
    files = root / "journal-files"  # a journald namespace keeps its files in /var/log/journal
    files.mkdir(exist_ok=True)
    _run("mount", "--bind", str(files), "/var/log")
    journald = subprocess.Popen([JOURNALD, NAMESPACE], preexec_fn=_die_with_parent)
    own = Path(f"/run/systemd/journal.{NAMESPACE}")
    _wait_for(own / "socket", journald)
    _wait_for(own / "stdout", journald)
    Path("/run/systemd/journal").mkdir()
    _run("mount", "--bind", str(own), "/run/systemd/journal")
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    daemon = subprocess.Popen(
        ["systemd-cat", "-t", "gpusvd", "sh", "-c", SHIM, "sh", *argv],
        preexec_fn=_die_with_parent,
    )
    while not stop and daemon.poll() is None:
        time.sleep(0.05)
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
    code = daemon.wait()
    journald.terminate()
    journald.wait()
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
