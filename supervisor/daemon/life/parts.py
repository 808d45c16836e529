"""What the composition root builds: every service of the daemon, and its phase."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from supervisor.daemon.broker import Broker
from supervisor.daemon.config import Config
from supervisor.daemon.dispatcher import Dispatcher
from supervisor.daemon.engine import Engine
from supervisor.daemon.life.deadman import Deadman
from supervisor.daemon.life.systemd import Notifier
from supervisor.daemon.liveness import HealthBoard
from supervisor.daemon.requests.access import Access
from supervisor.daemon.requests.handlers import Api
from supervisor.daemon.requests.server import Server
from supervisor.daemon.requests.telemetry import Telemetry
from supervisor.daemon.running.keepers import Keepers
from supervisor.daemon.running.runner import Runner
from supervisor.daemon.store.database import Store
from supervisor.daemon.store.memory_book import MemoryBook
from supervisor.daemon.watch.gpu_monitor import GpuMonitor
from supervisor.daemon.watch.hangs import HangWatcher
from supervisor.daemon.watch.hooks import Hooks


class DaemonPhase(Enum):
    """Where the daemon is in its life; shutdown runs start-up backwards."""

    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Parts:
    cfg: Config
    store: Store
    broker: Broker
    engine: Engine
    book: MemoryBook
    monitor: GpuMonitor
    dispatcher: Dispatcher
    hangs: HangWatcher
    runner: Runner
    keepers: Keepers
    hooks: Hooks
    deadman: Deadman
    notifier: Notifier
    board: HealthBoard
    telemetry: Telemetry
    server: Server
    access: Access
    api: Api
    phase: DaemonPhase = DaemonPhase.STARTING
    load_config: Callable[[], Config] | None = None  # SIGHUP reads the config again
