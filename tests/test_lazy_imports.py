"""The daemon's optional libraries wait for their first use: an idle daemon on simulated
cards, never scraped, whose jobs have no --progress-regex, carries none of them, even
once it has started jobs (each
costs it one to several MiB of resident memory)."""

from __future__ import annotations

import subprocess
import sys

LAZY = {"pynvml", "prometheus_client", "regex", "http.server", "wsgiref.simple_server"}


def loaded_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_importing_the_daemon_loads_none_of_them() -> None:
    assert not loaded_after("import supervisor.daemon.life.app") & LAZY


def test_simulated_cards_metrics_and_a_plain_job_load_none_of_them() -> None:
    code = """
import tempfile
from pathlib import Path
from supervisor.daemon.watch.metrics import Metrics
from supervisor.faults.watchdog import ProgressTracker
from supervisor.gpus import open_backend
from supervisor.gpus.nvml_events import xid_event_sources
backend, _ = open_backend("2x24G", Path(tempfile.mkdtemp()), env={})
assert xid_event_sources(backend) == []
import dataclasses
from supervisor.core.jobs import Job, JobSpec, JobState
spec = JobSpec(argv=("true",), cwd="/", env={}, owner_uid=0, owner_gid=0)
queued = Job(id=1, spec=spec, submitted_at="2026-01-01T00:00:00.000Z")
started = dataclasses.replace(queued, state=JobState.RUNNING, attempts=1)
m = Metrics()
m.observe_job(queued, started)  # a first start is timed without prometheus_client
assert sum(m.latency.state[0]) == 1
ProgressTracker(None, 0.0).on_output("step 1\\n", 1.0)
"""
    assert not loaded_after(code) & LAZY


def test_each_is_loaded_by_what_uses_it() -> None:
    code = """
from supervisor.daemon.watch.metrics import Metrics
from supervisor.daemon.watch.metrics_snapshot import Snapshot
from supervisor.faults.watchdog import ProgressTracker
assert "gpusv_jobs" in Metrics().render(Snapshot())
ProgressTracker(r"step (\\d+)", 0.0)
"""
    assert {"prometheus_client", "regex"} <= loaded_after(code)
