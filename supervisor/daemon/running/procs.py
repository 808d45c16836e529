"""A running attempt as the runner holds it (its process and live figures), and what
the runner asks of the kernel-log watcher about its end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.core.jobs import ExitStatus
from supervisor.daemon.running.handles import KeptProcess
from supervisor.keeper.journal import Record

if TYPE_CHECKING:
    from supervisor.faults.watchdog import ProgressTracker


@dataclass
class Proc:
    """A running attempt's process and its live figures: runtime, not job state."""

    job_id: int
    n: int
    cards: tuple[int, ...]
    seq: int
    started_mono: float
    handle: KeptProcess
    rss_mb: int = 0
    peak_rss_mb: int = 0
    peak_vram_mb: int = 0  # summed over its cards, as the backend reads its processes
    tracker: ProgressTracker | None = None
    oom_kills_at_start: int | None = None
    aborting: bool = False
    oom_score_adj: int | None = None  # as last written to its tree; None: not known
    # Its leader has exited (its keeper started the job parked behind it): what is left
    # of its tree is killed at its end (runner.end), so its OOM rank is not written.
    leader_ended: bool = False


def peak_mb(sampled_mb: int, kernel_bytes: int | None) -> int:
    """The attempt's recorded peak: its cgroup's high-water mark where the kernel kept
    one (exact, however short the peak; what a limit on the job would be held to), else
    the most the sampler saw of its processes' RSS. Rounded up: a job that charged a few
    hundred KiB still ran with a figure, and so still adds to its key's history."""
    return -(-kernel_bytes // 2**20) if kernel_bytes else sampled_mb


def may_have_leftovers(ended: Record | None) -> bool:
    """Whether processes of the job may outlive its leader: unknown unless its keeper
    counted its cgroup empty at the exit (nothing joins an empty cgroup)."""
    return ended is None or ended.leftovers > 0 or not (ended.cgroup or ended.memcg)


class Evidence(Protocol):
    """What the kernel-log watcher knows about an attempt's end (hangs.HangWatcher)."""

    def hang_evidence(self, cards: tuple[int, ...], since: float) -> dict[str, Any] | None: ...

    async def wait_for_fault(
        self, cards: tuple[int, ...], since: float
    ) -> dict[str, Any] | None: ...

    def oom_evidence(self, p: Proc, status: ExitStatus, own: int | None) -> str | None: ...

    def oom_kills_now(self) -> int | None: ...

    def machine(self, card: int | None) -> dict[str, Any]: ...
