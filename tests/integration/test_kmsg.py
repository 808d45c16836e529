"""The daemon on the real kernel log: lines written to /dev/kmsg (as root), each labelled
so that whoever reads dmesg sees that the gpusv test suite wrote it and no card failed.

The lines name the bus id of the last card of a 40-card simulated machine
(0000:28:00.0), which no other test's daemon has. Every daemon that reads /dev/kmsg sees
every line, so the tests that start one hold a lock that every copy of this suite on the
machine shares: two such daemons never run at once.
"""

from __future__ import annotations

import fcntl
import os
import signal
import uuid
from collections.abc import Callable, Iterator

import pytest

from .conftest import Daemon

KMSG = "/dev/kmsg"
LOCK = "/tmp/gpusv-test-kmsg.lock"
CARDS = 40
LAST_BUS = f"0000:{CARDS:02x}:00"  # card 39

pytestmark = [
    pytest.mark.root("writing /dev/kmsg needs root"),
    pytest.mark.skipif(not os.access(KMSG, os.W_OK), reason="/dev/kmsg is not writable here"),
]


class Kmsg:
    def __init__(self) -> None:
        self.tag = f"gpusv-test[{uuid.uuid4().hex[:8]}]"

    def write(self, text: str) -> str:
        """One labelled record at warning level; returns the text as the daemon reads it."""
        line = f"{self.tag} (a test line, no real fault): {text}"
        fd = os.open(KMSG, os.O_WRONLY)
        try:
            os.write(fd, f"<4>{line}\n".encode())
        finally:
            os.close(fd)
        return line

    def sync(self, d: Daemon, what: str) -> None:
        """Write a line for a bus no card has until the daemon logs reading it: then it
        reads /dev/kmsg, and has read every line written before this one."""
        marker = f"{uuid.uuid4().hex[:8]}"

        def seen() -> bool:
            self.write(f"NVRM: Xid (PCI:0000:fe:00): 109, pid=1, name={marker}, Ch 00000008")
            return marker in d.log_text()

        d.wait_for(seen, what=what)


@pytest.fixture(autouse=True)
def one_kmsg_daemon_at_a_time() -> Iterator[None]:
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield  # the daemon (make_daemon's) is gone before the lock is let go
        fcntl.flock(fh, fcntl.LOCK_UN)


def kmsg_daemon(make_daemon: Callable[..., Daemon]) -> Daemon:
    d = make_daemon(gpus=f"{CARDS}x1G", config="cpu_slots = 2\n", start=False)
    d.kernel_source = "kmsg"
    return d.start()


def test_an_xid_line_on_the_real_kernel_log_fails_the_attempt_as_a_hang(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = kmsg_daemon(make_daemon)
    kmsg = Kmsg()
    kmsg.sync(d, "the daemon to read /dev/kmsg")
    others = d.submit("sleep", "300", gpus=CARDS - 1)  # cards 0 to 38
    assert d.wait_state(others, "running")["gpus"] == list(range(CARDS - 1))
    script = 'if [ "$GPUSV_ATTEMPT" = 1 ]; then exec sleep 300; fi'
    job = d.submit("sh", "-c", script)
    d.wait_pid(job)
    assert d.show(job)["gpus"] == [CARDS - 1]
    line = kmsg.write(
        f"NVRM: Xid (PCI:{LAST_BUS}): 109, pid=1, name=gpusv-test, Ch 00000020, "
        "errorString CTX SWITCH TIMEOUT, Info 0xac00d"
    )
    done = d.wait_done(job)
    assert done["state"] == "succeeded"
    first = done["attempts"][0]
    assert first["reason"] == "gpu_hang"
    assert first["evidence"]["source"] == "kernel_log"
    assert first["evidence"]["lines"][0].endswith(line)
    (hang,) = d.call({"type": "stats"})["gpu_hangs"]
    assert (hang["job"], hang["gpu"], hang["pci_bus_id"]) == (job, CARDS - 1, f"{LAST_BUS}.0")
    shown = d.show(others)  # the line named one card: the job on the others goes on
    assert shown["state"] == "running" and len(shown["attempts"]) == 1
    d.cli("cancel", str(others))


def test_a_killed_process_line_on_the_real_kernel_log_is_oom_evidence(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = kmsg_daemon(make_daemon)
    kmsg = Kmsg()
    job = d.submit("sleep", "300", gpus=0, retries=0)
    pid = d.wait_pid(job)
    kmsg.write(
        f"Out of memory: Killed process {pid} (sleep) total-vm:1000kB, anon-rss:100kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:1000"
    )
    kmsg.sync(d, "the daemon to read the Killed process line")
    os.kill(pid, signal.SIGKILL)  # what the kernel's OOM killer would have done
    done = d.wait_done(job)
    assert done["reason"] == "oom_killed"
    assert done["attempts"][0]["signal"] == 9
    assert done["attempts"][0]["evidence"] == {"source": "kernel_log"}
