"""The abort deadman: the pure decision, the watcher, exit 70 in a real process, forensics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, cast

import anyio
import psutil
import pytest
import structlog
from structlog.testing import CapturingLogger

from supervisor.daemon.life.deadman import (
    DEADLINE_ENV,
    DEADMAN_EXIT_CODE,
    Deadman,
    abort_deadline_s,
    wait_for_abort,
)
from supervisor.daemon.life.forensics import (
    Forensics,
    WatchedAbort,
    describe_abort,
    describe_jobs,
    nvidia_smi_read,
    thread_stacks,
)

REPO = Path(__file__).resolve().parents[3]
PATIENCE_S = 10.0  # how long a test waits for something that should take milliseconds


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


# -- wait_for_abort: the pure decision --------------------------------------------------


def test_abort_that_returned_is_returned() -> None:
    done = threading.Event()
    done.set()
    assert wait_for_abort(done, deadline=time.monotonic() + 60) == "returned"


def test_abort_that_never_returns_is_wedged_without_real_waiting() -> None:
    clock = FakeClock()
    waits: list[float] = []

    def wait(done: threading.Event, timeout: float) -> bool:
        waits.append(timeout)
        clock.t += timeout
        return False

    outcome = wait_for_abort(threading.Event(), clock.t + 60, now=clock.now, wait=wait)
    assert outcome == "wedged"
    assert waits == [60]


def test_abort_landing_in_the_last_instant_counts_as_returned() -> None:
    clock = FakeClock()

    def wait(done: threading.Event, timeout: float) -> bool:
        clock.t += timeout + 0.5  # woke after the deadline...
        done.set()  # ...and the abort had just returned
        return False

    outcome = wait_for_abort(threading.Event(), clock.t + 60, now=clock.now, wait=wait)
    assert outcome == "returned"


def test_abort_done_exactly_at_the_deadline_is_returned() -> None:
    clock = FakeClock()
    done = threading.Event()
    done.set()
    assert wait_for_abort(done, clock.t, now=clock.now, wait=lambda d, t: False) == "returned"


def test_early_wakeups_keep_waiting_for_the_rest_of_the_deadline() -> None:
    clock = FakeClock()
    waits: list[float] = []

    def wait(done: threading.Event, timeout: float) -> bool:
        waits.append(timeout)
        clock.t += 10  # a spurious wake-up, long before the deadline
        return False

    assert wait_for_abort(threading.Event(), clock.t + 25, now=clock.now, wait=wait) == "wedged"
    assert waits == [25, 15, 5]


# -- abort_deadline_s ---------------------------------------------------------------------


def test_deadline_comes_from_config_unless_the_environment_overrides() -> None:
    assert abort_deadline_s(60.0, {}) == 60.0
    assert abort_deadline_s(60.0, {DEADLINE_ENV: "2.5"}) == 2.5


@pytest.mark.parametrize("raw", ["", "soon", "0", "-3", "nan", "inf"])
def test_bad_environment_deadline_names_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=DEADLINE_ENV):
        abort_deadline_s(60.0, {DEADLINE_ENV: raw})


def test_bad_config_deadline_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"deadman\.abort_deadline_s"):
        abort_deadline_s(0.0, {})


# -- the real thing, in a real process ----------------------------------------------------

WEDGED_SCRIPT = """
import threading, time
from supervisor.daemon.life.deadman import Deadman
deadman = Deadman(1.0)
deadman.start()
deadman.run_abort(threading.Event().wait, "job-17")   # blocks for ever
print("abort started", flush=True)
time.sleep(60)
"""

RETURNING_SCRIPT = """
import threading
from supervisor.daemon.life.deadman import Deadman
deadman = Deadman(3.0)
deadman.start()
future = deadman.run_abort(lambda: "ok", "job-18")
assert future.result(timeout=30) == "ok"
print("returned", flush=True)
# A wedged abort with the same deadline, started after the first returned: the exit it
# causes must name it alone. Had the returned abort stayed watched, its earlier deadline
# would have fired first and the report would name job-18.
deadman.run_abort(threading.Event().wait, "job-19")
threading.Event().wait(120)
"""


def _python(script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_wedged_abort_exits_70_with_forensics_on_stderr() -> None:
    proc = _python(WEDGED_SCRIPT)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "abort started"
    started = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started

    # No bound on the time asserted: under load the exit may come late, and the report
    # below names the 1 s deadline it acted on.
    print(f"exit 70 came {elapsed:.1f} s after the abort started (deadline 1 s)")
    assert proc.returncode == DEADMAN_EXIT_CODE, stderr
    assert "abort 'job-17' did not return within 1 s" in stderr
    assert "what: job-17" in stderr
    assert "nvidia-smi" in stderr
    _, _, rest = stderr.partition("Thread 'abort-job-17'")
    assert rest, stderr
    stack = rest.split("\n\nThread ")[0]
    assert "<-- the wedged abort" in stack.splitlines()[0]
    assert "in wait" in stack  # threading.Event().wait, where it is stuck


def test_an_abort_that_returned_is_never_the_one_that_fires() -> None:
    proc = _python(RETURNING_SCRIPT)
    stdout, stderr = proc.communicate(timeout=60)
    assert stdout.splitlines()[0] == "returned"
    assert proc.returncode == DEADMAN_EXIT_CODE, stderr
    assert "abort 'job-19' did not return within 3 s" in stderr
    assert "job-18" not in stdout + stderr


# -- the watcher, in process, with a recording exit --------------------------------------


class RecordingExit:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


def _capturing() -> tuple[Any, CapturingLogger]:
    cap = CapturingLogger()
    return structlog.wrap_logger(cap, processors=[]), cap


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown, so that the test's "wedged" aborts end with the test."""
    event = threading.Event()
    yield event
    event.set()


def _deadman(
    deadline_s: float, forensics: Callable[[WatchedAbort], str], **kw: Any
) -> tuple[Deadman, RecordingExit]:
    exit_ = RecordingExit()
    log, _ = _capturing()
    deadman = Deadman(
        deadline_s,
        forensics=forensics,
        exit=cast(Callable[[int], NoReturn], exit_),
        log=log,
        **kw,
    )
    return deadman, exit_


def test_a_later_abort_with_an_earlier_deadline_fires_first(release: threading.Event) -> None:
    fired: list[str] = []

    def forensics(abort: WatchedAbort) -> str:
        fired.append(abort.what)
        return "report"

    deadman, exit_ = _deadman(60.0, forensics)
    deadman.start()
    try:
        deadman.run_abort(release.wait, "slow", deadline_s=60.0)
        time.sleep(0.05)  # the watcher is now waiting on the 60 s deadline
        deadman.run_abort(release.wait, "fast", deadline_s=0.2)
        assert exit_.called.wait(PATIENCE_S), "the 0.2 s deadline was not noticed"
        assert fired == ["fast"]
        assert exit_.codes == [DEADMAN_EXIT_CODE]
        assert [a.what for a in deadman.in_flight()] == ["slow"]
    finally:
        deadman.stop()


def test_returned_and_raising_aborts_never_fire(release: threading.Event) -> None:
    fired: list[str] = []

    def forensics(abort: WatchedAbort) -> str:
        fired.append(abort.what)
        return "report"

    deadman, exit_ = _deadman(2.0, forensics)
    deadman.start()
    try:

        def boom() -> None:
            raise RuntimeError("kill failed")

        assert deadman.run_abort(lambda: 7, "job-1").result(PATIENCE_S) == 7
        with pytest.raises(RuntimeError, match="kill failed"):
            deadman.run_abort(boom, "job-2").result(PATIENCE_S)
        assert deadman.in_flight() == []
        # A wedged one with the same deadline, started later: the deadline that passes
        # first belongs to the returned ones, and only the wedged one may fire.
        deadman.run_abort(release.wait, "job-3")
        assert exit_.called.wait(PATIENCE_S), "the wedged abort was not noticed"
        assert fired == ["job-3"]
        assert exit_.codes == [DEADMAN_EXIT_CODE]
    finally:
        deadman.stop()


def test_stuck_forensics_still_ends_in_exit_70(
    release: threading.Event, capfd: pytest.CaptureFixture[str]
) -> None:
    deadman, exit_ = _deadman(0.2, lambda abort: str(release.wait()), forensics_timeout_s=0.3)
    deadman.start()
    try:
        deadman.run_abort(release.wait, "job-3")
        assert exit_.called.wait(PATIENCE_S)
    finally:
        deadman.stop()
    err = capfd.readouterr().err
    assert "forensics did not finish within 0.3 s" in err
    assert "Thread 'abort-job-3'" in err
    assert exit_.codes == [DEADMAN_EXIT_CODE]


async def test_call_runs_on_a_named_thread_without_blocking_the_loop() -> None:
    deadman, _ = _deadman(30.0, lambda abort: "report")
    unblocked = threading.Event()

    def blocking_query() -> str:
        # Returns only if the loop keeps running while this thread waits.
        assert unblocked.wait(PATIENCE_S)
        return threading.current_thread().name

    async def unblock_soon() -> None:
        await asyncio.sleep(0.05)
        unblocked.set()

    task = asyncio.create_task(unblock_soon())
    assert await deadman.call(blocking_query, "gpu-0-query") == "abort-gpu-0-query"
    await task


def _watchers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "deadman"}


async def test_run_stops_only_a_watcher_it_started(release: threading.Event) -> None:
    deadman, exit_ = _deadman(0.2, lambda abort: "report")
    before = _watchers()
    async with anyio.create_task_group() as tg:
        await tg.start(deadman.run)
        (mine,) = _watchers() - before
        tg.cancel_scope.cancel()
    assert not mine.is_alive()

    deadman.start()  # as the daemon does: before its task group, stopped after it
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(deadman.run)
            tg.cancel_scope.cancel()
        deadman.run_abort(release.wait, "job-4")  # an abort made while shutting down
        assert exit_.called.wait(PATIENCE_S), "the deadman stopped watching too early"
    finally:
        deadman.stop()


def test_deadlines_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Deadman(0)
    with pytest.raises(ValueError, match="job-5"):
        Deadman(1.0).run_abort(lambda: None, "job-5", deadline_s=-1)


# -- forensics ----------------------------------------------------------------------------


def _abort(**kw: Any) -> WatchedAbort:
    fields: dict[str, Any] = {
        "what": "job-17",
        "thread_name": "abort-job-17",
        "started_at": 1_700_000_000.0,
        "started_mono": 500.0,
        "deadline_s": 60.0,
        "native_id": 4242,
    }
    return WatchedAbort(**(fields | kw))


def test_describe_abort_is_exact() -> None:
    assert describe_abort(_abort(), now_mono=563.25) == (
        "what: job-17\n"
        "thread: abort-job-17 (tid 4242)\n"
        "started: 2023-11-14T22:13:20+00:00 (63.2 s ago, monotonic)\n"
        "deadline: 60 s"
    )


def test_thread_stacks_name_and_mark_threads(release: threading.Event) -> None:
    def parked_in_the_driver() -> None:
        release.wait()

    thread = threading.Thread(target=parked_in_the_driver, name="abort-job-9", daemon=True)
    thread.start()
    assert thread.ident is not None
    text = thread_stacks({thread.ident: "the wedged abort"})
    first = text.split("\n\n")[0]  # marked threads come first
    assert first.startswith("Thread 'abort-job-9'")
    assert "<-- the wedged abort" in first
    # Its kernel state (R while still going to sleep, then S) and wait channel.
    assert re.search(r"\[kernel state [RS], wchan \S+\]", first.splitlines()[0])
    assert "parked_in_the_driver" in first
    assert "test_thread_stacks_name_and_mark_threads" not in text  # the caller is left out


def test_report_survives_a_broken_provider_and_reads_real_processes(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI 550.54  Driver Version: 550.54'\n")
    smi.chmod(0o755)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 20  # just forked, it may not be asleep yet under load
        while psutil.Process(sleeper.pid).status() != "sleeping" and time.monotonic() < deadline:
            time.sleep(0.01)

        def broken() -> list[str]:
            raise RuntimeError("kernel-log watcher gone")

        forensics = Forensics(
            running_jobs=lambda: [{"job_id": 17, "pids": [sleeper.pid], "gpus": [0]}],
            recent_kernel_lines=broken,
            nvidia_smi=str(smi),
        )
        report = forensics(_abort(started_mono=time.monotonic()))
    finally:
        sleeper.kill()
        sleeper.wait()

    assert report.startswith("gpusvd deadman: abort 'job-17' did not return within 60 s")
    assert "NVIDIA-SMI 550.54" in report
    assert f"job 17: pids {sleeper.pid} gpus=[0]" in report
    assert f"pid {sleeper.pid} (sleep) status sleeping wchan " in report
    assert "--- recent kernel log ---\n(unavailable: RuntimeError: kernel-log watcher gone)" in (
        report
    )
    titles = [line for line in report.splitlines() if line.startswith("--- ")]
    assert titles == [
        "--- abort ---",
        "--- threads ---",
        f"--- {smi} (live) ---",
        "--- running jobs ---",
        "--- processes in uninterruptible sleep (D) ---",
        "--- recent kernel log ---",
    ]


def test_nvidia_smi_missing_or_hung(tmp_path: Path) -> None:
    assert nvidia_smi_read("gpusv-no-such-nvidia-smi") == "gpusv-no-such-nvidia-smi not found"
    hung = tmp_path / "nvidia-smi"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    assert nvidia_smi_read(str(hung), timeout_s=0.3).endswith(
        "did not answer within 0.3 s (killed; stuck in the driver?)"
    )


def test_jobs_with_vanished_pids_and_no_jobs() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert describe_jobs([{"id": 3, "pids": [gone.pid]}]) == (
        f"job 3: pids {gone.pid}\n  pid {gone.pid}: NoSuchProcess"
    )
    assert describe_jobs([]) == "no running jobs"


def test_default_forensics_says_what_is_not_registered() -> None:
    report = Forensics(nvidia_smi="gpusv-no-such-nvidia-smi")(_abort())
    assert "no running-jobs provider registered" in report
    assert "no kernel-log provider registered" in report
