"""gpusvd's journal fields through a real systemd-journald: a daemon whose stderr is a
journal stream (as under its unit) sends its entries over the native protocol, and
journalctl's own matches select one job's story, a hang by its MESSAGE_ID, a card.

journald runs in a private mount namespace of the test's own (journal_namespace.py):
the host's journal is never seen nor written. Skipped, with the reason, where that
cannot be made (not root, no systemd-journald, no mount namespaces)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.daemon.life import journal

from .conftest import Daemon
from .test_gpu_hangs import HANG_ONCE, XID_109_CARD0

DRIVER = Path(__file__).with_name("journal_namespace.py")
Entry = dict[str, Any]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a mount namespace and a journald of its own"
    missing = [t for t in ("unshare", "systemd-cat", "journalctl") if shutil.which(t) is None]
    if missing or not Path("/lib/systemd/systemd-journald").exists():
        return f"no systemd-journald or {', '.join(missing) or 'its tools'} here"
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        return "cannot make a mount namespace here"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def start_under_journald(d: Daemon) -> None:
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, str(DRIVER)]
    with open(d.log, "ab") as log:
        d.proc = subprocess.Popen(
            [*argv, str(d.root), *d.argv()],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=d.env,
            cwd=Path(__file__).parents[2],
        )
    d.wait_ready(timeout=60)


def query(d: Daemon, *matches: str) -> list[Entry]:
    """journalctl's own matching, over the journal files the test's journald wrote."""
    (where,) = {p.parent for p in (d.root / "journal-files").rglob("*.journal")}
    argv = ["journalctl", "--directory", str(where), "-o", "json", "--no-pager", *matches]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_journalctl_selects_a_jobs_story_its_hang_and_its_card(
    make_daemon: Callable[..., Daemon],
) -> None:
    d = make_daemon(start=False)
    start_under_journald(d)
    marker = d.root / "started"
    hung = d.submit("sh", "-c", HANG_ONCE.format(marker=marker))
    d.wait_for(marker.exists, what="the job to start")
    d.append_kernel(XID_109_CARD0)
    assert d.wait_done(hung)["state"] == "succeeded"
    failed = d.submit("sh", "-c", "exit 3", retries=0)
    assert d.wait_done(failed)["state"] == "failed"
    assert d.stop(timeout=60) == 0, d.log_text()[-4000:]

    story = query(d, f"GPUSV_JOB={hung}")
    kinds = [e["GPUSV_EVENT"] for e in story]
    assert kinds[0] == "submitted" and kinds[-1] == "exited", kinds
    assert "gpu_hang" in kinds and kinds.count("started") == 2
    assert all(e["SYSLOG_IDENTIFIER"] == "gpusvd" for e in story)
    assert all(e["_TRANSPORT"] == "journal" for e in story)  # native, not stream lines
    (hang,) = query(d, f"MESSAGE_ID={journal.GPU_HANG}")
    assert hang["GPUSV_JOB"] == str(hung) and hang["GPUSV_ATTEMPT"] == "1"
    assert hang["GPUSV_CARD"] == "0" and hang["GPUSV_GPU_UUID"].startswith("GPU-")
    assert hang["PRIORITY"] == "4"
    ended = query(d, f"GPUSV_JOB={failed}", "GPUSV_EVENT=exited")
    assert [(e["GPUSV_REASON"], e["PRIORITY"]) for e in ended] == [("exit_nonzero", "6")]
    on_card_0 = {e["GPUSV_JOB"] for e in query(d, "GPUSV_CARD=0") if "GPUSV_JOB" in e}
    assert str(hung) in on_card_0
    assert not query(d, f"GPUSV_JOB={failed}", f"MESSAGE_ID={journal.GPU_HANG}")
