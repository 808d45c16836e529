"""The shapes of requests and replies: the one contract of gpusv and gpusvd as types.

The daemon builds its replies as these types and the CLI reads them as these types (it
imports this module only under TYPE_CHECKING, so it costs nothing at run time); mypy
checks both ends against the same definitions. CONTRACT.md and docs/protocol.md say
what each field means.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict

State = Literal["queued", "running", "succeeded", "failed", "cancelled"]


# ---- requests ----------------------------------------------------------------------------


class SubmitRequest(TypedDict, total=False):
    type: Required[Literal["submit", "submit_batch"]]
    argv: list[str]
    argvs: list[list[str]]
    cwd: Required[str]
    env: dict[str, str]
    name: str
    labels: dict[str, str]
    gpus: int
    vram_mb: int
    mem_mb: int
    mem_key: str
    mem_scale: float
    retries: int
    gpu_hang_retries: int
    progress_timeout_s: float
    progress_regex: str
    stall_timeout_s: float
    priority: int
    after: list[int]
    after_any: list[int]
    share: bool
    cards: list[int]  # run only on these cards
    not_cards: list[int]  # never on these
    dry_run: bool
    request_id: str
    version: int


class UpdateRequest(TypedDict, total=False):
    """`update`: new values for queued jobs; at least one of them. `cards` [] unpins."""

    type: Required[Literal["update"]]
    ids: Required[list[int]]
    priority: int
    time_limit_s: float
    cards: list[int]
    version: int


class JobRefRequest(TypedDict, total=False):
    type: Required[Literal["show", "cancel", "wait", "logs"]]
    ids: Required[list[int]]
    timeout_s: float | None
    stream: Literal["stdout", "stderr"]
    offset: int
    version: int


class ListRequest(TypedDict, total=False):
    type: Required[Literal["list"]]
    states: list[str] | None
    limit: int
    before_id: int
    array: int
    version: int


class SimpleRequest(TypedDict, total=False):
    type: Required[Literal["ping", "gpus", "stats", "health", "metrics", "top"]]
    version: int


Request = SubmitRequest | JobRefRequest | ListRequest | SimpleRequest


# ---- the job object ------------------------------------------------------------------------


class Budget(TypedDict):
    used: int
    budget: int


class Retries(TypedDict):
    ordinary: Budget
    gpu_hang: Budget


class HostMemory(TypedDict):
    projected_mb: int
    basis: Literal["observed", "fit", "declared"]
    runs: int
    peak_mb: int | None  # the highest peak of the runs behind the history's figure


class AttemptJson(TypedDict):
    n: int
    gpus: list[int]
    gpu_uuids: list[str]
    pid: int | None
    started_at: str
    ended_at: str | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    peak_rss_mb: int | None
    peak_vram_mb: int | None
    evidence: dict[str, Any] | None
    stopping: str | None  # a running attempt being stopped: the stop's reason
    rss_mb: NotRequired[int]  # a running attempt's tree now
    output_dropped_bytes: NotRequired[int]  # its output the disk refused (with `show`)


class ArrayRefJson(TypedDict):
    id: int
    index: int


class JobJson(TypedDict):
    id: int | None  # None in a dry run
    name: str
    argv: list[str]
    cwd: str
    owner_uid: int
    labels: dict[str, str]
    mem_key: str
    state: State
    waiting_for: str | None
    gpus_requested: int
    gpus: list[int]
    host_memory: HostMemory | None
    retries: Retries
    reason: str | None
    exit_code: int | None
    priority: int
    after: list[int]
    after_any: list[int]
    progress: str | None
    vram_mb: int | None
    mem_mb: int | None
    mem_scale: float | None
    share: bool  # may share its one card with other shared jobs
    array_id: int | None
    array_index: int | None
    array: ArrayRefJson | None
    max_running: int | None
    held: bool  # held with `gpusv hold`: does not start until released
    stopping: bool  # running, and being stopped: signalled, not yet gone
    starting: bool  # running, its process not up yet (being started, or started ahead)
    time_limit_s: float | None  # wall-time limit per run (--time)
    cards: list[int] | None  # pinned: the cards it may run on (--cards, --not-cards)
    submitted_at: str
    started_at: str | None
    ended_at: str | None
    attempts: NotRequired[list[AttemptJson]]
    events: NotRequired[list[dict[str, Any]]]
    output_dropped_bytes: NotRequired[int]  # all attempts' output the disk refused (`show`)


class PublicJobJson(TypedDict):
    """What anyone who may connect sees of someone else's job."""

    id: int | None
    state: State
    owner_uid: int
    gpus: list[int]
    gpus_requested: int
    waiting_for: str | None
    submitted_at: str


# ---- replies -------------------------------------------------------------------------------


class SubmitReply(TypedDict, total=False):
    ok: Required[Literal[True]]
    ids: list[int]
    job: JobJson  # a single submit
    jobs: list[JobJson]  # a dry run
    repeated: bool  # a request id seen before: the first submit's jobs
    warnings: list[str]  # for the submitter's stderr: a need above the host's limit


class CancelResult(TypedDict, total=False):
    id: Required[int]
    ok: Required[bool]
    state: Literal["cancelled", "cancelling"]  # cancelled: nothing of the job will run
    error: str


class CancelReply(TypedDict):
    ok: Literal[True]
    results: list[CancelResult]


class ShowReply(TypedDict):
    ok: Literal[True]
    job: JobJson
    paused: bool  # the queue is paused (`gpusv pause`): no queued job starts


class ListReply(TypedDict):
    ok: Literal[True]
    jobs: list[JobJson | PublicJobJson]
    paused: bool  # the queue is paused (`gpusv pause`): no queued job starts


class WaitReply(TypedDict):
    ok: Literal[True]
    jobs: list[JobJson | PublicJobJson]
    timed_out: bool


class LogSegment(TypedDict):
    stream: str  # "stdout", "stderr", or "gpusv" (the line between two attempts)
    data_b64: str


class LogsReply(TypedDict):
    ok: Literal[True]
    data_b64: str  # one stream's bytes; empty for "both", whose bytes are in `segments`
    offset: int  # "both": a position in the merged stream
    size: int  # the log's size now, for --tail
    done: bool
    state: State
    segments: NotRequired[list[LogSegment]]  # "both": in the order they were written


class ErrorBody(TypedDict):
    code: str
    message: str


class ErrorReply(TypedDict):
    ok: Literal[False]
    error: ErrorBody
