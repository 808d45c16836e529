"""What every test gets: the process-wide state it may change put back afterwards, and the
random order's seed printed at the end, so that an order-dependent failure reproduces;
and `store`, a real SQLite store in the test's own directory, for those that ask."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import settings

from supervisor.daemon.life import log_setup as logs
from supervisor.daemon.store.database import Store
from tests import hung_fs

# No test asserts on time: a generated example that runs slow on a busy machine is no
# failure (hypothesis's default deadline is 200 ms per example).
settings.register_profile("gpusv", deadline=None)
settings.load_profile("gpusv")


@pytest.fixture
def hung() -> Iterator[hung_fs.Hung]:
    """A file system that does not answer, mounted for the test (tests/hung_fs.py)."""
    why = hung_fs.why_not()
    if why is not None:
        pytest.skip(why)
    with hung_fs.hung_mount(Path(tempfile.mkdtemp(prefix="hung-", dir="/tmp"))) as mount:
        yield mount
    mount.path.rmdir()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "gpusv.db")
    try:
        yield s
    finally:
        await s.close()


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1)


@pytest.fixture(autouse=True)
def _restore_process_globals() -> Iterator[None]:
    """Logging set-up (structlog and the stdlib root logger), the environment, the working
    directory, the umask and signal handlers: a test or the code it calls may change
    any of them (logs.configure binds structlog to pytest's capture stream, which is
    closed once the test ends), and the next test must not inherit that."""
    structlog_config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    bridge = logs._bridge_handler
    environ = dict(os.environ)
    cwd = os.getcwd()
    umask = os.umask(0o022)
    os.umask(umask)
    handlers_by_signal: dict[int, Any] = {s: signal.getsignal(s) for s in _SIGNALS}
    yield
    structlog.reset_defaults()
    structlog.configure(**structlog_config)
    root.handlers[:] = handlers
    root.setLevel(level)
    logs._bridge_handler = bridge
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)
    if os.getcwd() != cwd:
        os.chdir(cwd)
    os.umask(umask)
    for sig, handler in handlers_by_signal.items():
        if handler is not None and signal.getsignal(sig) != handler:
            signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def _no_keeper_outlives_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keepers outlive their daemon by design; a test's must not outlive the test run."""
    yield
    import psutil

    from supervisor.daemon.running.keeper_processes import keeper_processes

    left = keeper_processes(tmp_path_factory.getbasetemp())
    for proc in left:
        proc.kill()
    psutil.wait_procs(left, timeout=5)
    assert not left, f"keepers left running: {[p.info['cmdline'] for p in left]}"


_INTEGRATION = Path(__file__).parent / "integration"
_HOST = Path(__file__).parent / "host"


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """tests/host/ boots a machine with its own systemd: only scripts/test-host.sh runs it
    (it sets GPUSV_HOST_SUITE=1); every other run leaves it out, uncollected."""
    if os.environ.get("GPUSV_HOST_SUITE") != "1" and collection_path == _HOST:
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration/ starts a real gpusvd or keeper: it carries the
    `integration` marker, so that `-m "not integration"` runs the unit tests alone. A
    `root` marker must say why the test needs root."""
    for item in items:
        if _INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
        marker = item.get_closest_marker("root")
        if marker is not None and not (marker.args and isinstance(marker.args[0], str)):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.root needs its reason")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `root` says in one line why it needs root, and skips without it."""
    marker = item.get_closest_marker("root")
    if marker is not None and os.geteuid() != 0:
        pytest.skip(f"needs root: {marker.args[0]}")


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(
            f"random test order, seed {seed}: rerun it with scripts/test.sh --randomly-seed={seed}"
        )
