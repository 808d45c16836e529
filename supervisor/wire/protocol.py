"""The wire protocol shared by gpusvd and gpusv: framing, request types and their validation.

Newline-delimited JSON over a Unix socket. One request object per line, one response per
request: ``{"ok": true, ...}`` or ``{"ok": false, "error": {"code", "message"}}``. Every
malformed input becomes a typed ProtocolError; nothing here raises anything else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from supervisor.wire import errors
from supervisor.wire.edits import Update, parse_update
from supervisor.wire.fields import MAX_ID as MAX_ID
from supervisor.wire.fields import _Fields, _str_list
from supervisor.wire.framing import MAX_LINE as MAX_LINE  # re-exported: the framing is protocol too
from supervisor.wire.framing import VERSION as VERSION
from supervisor.wire.framing import encode as encode

# The error codes and the exception are protocol too: re-exported.
BAD_JSON = errors.BAD_JSON
BAD_REQUEST = errors.BAD_REQUEST
UNKNOWN_TYPE = errors.UNKNOWN_TYPE
TOO_LARGE = errors.TOO_LARGE
NOT_FOUND = errors.NOT_FOUND
FORBIDDEN = errors.FORBIDDEN
BUSY = errors.BUSY
LIMIT = errors.LIMIT
DRAINING = errors.DRAINING
INVALID_STATE = errors.INVALID_STATE
INTERNAL = errors.INTERNAL
STORAGE = errors.STORAGE
ProtocolError = errors.ProtocolError

MAX_ARGV = 4096
MAX_ARG_BYTES = 128 * 1024
MAX_ENV = 4096
MAX_ENV_BYTES = 512 * 1024
MAX_LABELS = 64
MAX_LABEL_KEY = 64
MAX_LABEL_VALUE = 1024
MAX_NAME = 256
MAX_GPUS = 64
MAX_BATCH = 100_000
MAX_RETRIES = 10_000
MAX_SIZE_MB = 2**40  # a petabyte: anything larger is a typo
MAX_LIST = 10_000
MAX_REQUEST_ID = 256
# A scale is a ratio the projection divides by and extrapolates with: positive, and
# bounded so that no projection overflows.
MIN_SCALE, MAX_SCALE = 1e-6, 1e12
LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]+$")
# Only a \uD800-\uDFFF escape can put a surrogate into decoded text (raw UTF-8 cannot).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _lone_surrogate(text: str, obj: Any) -> bool:
    """True if a string in the decoded request is not Unicode: it could be neither stored
    nor executed nor echoed back in an answer."""
    if not _SURROGATE_ESCAPE.search(text):
        return False
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return True
    return False


def decode_line(raw: bytes) -> dict[str, Any]:
    """Bytes of one line (without the newline) -> a JSON object, or ProtocolError."""
    if len(raw) > MAX_LINE:
        raise ProtocolError(TOO_LARGE, f"request line over {MAX_LINE} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(BAD_JSON, f"request is not valid UTF-8: {exc.reason}") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ProtocolError(BAD_JSON, "request is nested too deeply") from None
    except ValueError as exc:
        raise ProtocolError(BAD_JSON, f"request is not JSON: {exc}") from None
    if _lone_surrogate(text, obj):
        raise ProtocolError(BAD_JSON, "request has a \\u escape of a lone surrogate: not Unicode")
    if not isinstance(obj, dict):
        raise ProtocolError(BAD_REQUEST, "request must be a JSON object")
    return obj


# ---- requests ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitOptions:
    cwd: str
    env: dict[str, str]
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    vram_mb: int | None = None
    mem_mb: int | None = None
    mem_key: str | None = None
    mem_scale: float | None = None
    retries: int | None = None
    gpu_hang_retries: int | None = None
    progress_timeout_s: float | None = None
    progress_regex: str | None = None
    priority: int = 0
    after: tuple[int, ...] = ()
    after_any: tuple[int, ...] = ()
    dry_run: bool = False
    request_id: str | None = None  # a repeat from the same user returns the first jobs
    time_limit_s: float | None = None
    run: bool = False  # tied to the connection: cancelled when it goes away
    stall_timeout_s: float | None = None
    share: bool = False
    array: tuple[int, ...] = ()  # one job per index, of one new array
    max_running: int | None = None  # of the array (or the batch) at most this many at once
    cards: tuple[int, ...] | None = None  # --cards: only these
    not_cards: tuple[int, ...] | None = None  # --not-cards: never these


@dataclass(frozen=True)
class Submit:
    """One command (``argvs`` of one) or a batch; all share the options."""

    argvs: tuple[tuple[str, ...], ...]
    options: SubmitOptions
    type: str = "submit"
    names: tuple[str, ...] | None = None  # a batch's per-command names


@dataclass(frozen=True)
class ListJobs:
    states: tuple[str, ...] = ()
    limit: int = 1000
    before_id: int | None = None
    type: str = "list"
    owner_uid: int | None = None
    recent_s: float | None = None  # active jobs, and those ended this recently
    array: int | None = None  # only the jobs of this array
    name: str | None = None  # only the jobs whose name matches this glob (* ? [...])
    labels: tuple[tuple[str, str], ...] = ()  # only the jobs with every one of these labels


@dataclass(frozen=True)
class JobRef:
    """show, cancel, wait, logs, restart, hold and release all name jobs by id
    (cancel may name none and say `all`)."""

    type: str
    ids: tuple[int, ...]
    timeout_s: float | None = None
    stream: str = "stdout"
    offset: int = 0
    follow: bool = False
    tail_lines: int | None = None
    all: bool = False


@dataclass(frozen=True)
class Simple:
    """ping, gpus, stats, health, metrics, top, pause, resume: no arguments."""

    type: str


@dataclass(frozen=True)
class Clean:
    """Remove the peer's finished jobs (an admin's: everyone's) and their logs."""

    older_than_s: float = 0.0
    type: str = "clean"


@dataclass(frozen=True)
class ArrayRef:
    """restart_array: the failed indices of an array, submitted again."""

    type: str
    array: int


Request = Submit | ListJobs | JobRef | Simple | Clean | ArrayRef | Update
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
SIMPLE_TYPES = ("ping", "gpus", "stats", "health", "metrics", "top", "pause", "resume")
REF_TYPES = ("show", "cancel", "wait", "logs", "restart", "hold", "release")
MAX_DURATION_S = 10 * 365 * 86400


def _submit_options(f: _Fields) -> SubmitOptions:
    cwd = f.str_("cwd", None, 4096)
    if not cwd or not cwd.startswith("/"):
        raise f.fail("cwd", "must be an absolute path")
    env = f.str_map("env", MAX_ENV, 4096, MAX_ARG_BYTES)
    if sum(len(k) + len(v) for k, v in env.items()) > MAX_ENV_BYTES:
        raise f.fail("env", f"larger than {MAX_ENV_BYTES} bytes")
    for key in env:
        if not key or "=" in key:
            raise f.fail("env", f"'{key[:40]}' is not a variable name (empty, or has '=')")
    labels = f.str_map("labels", MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE)
    for key in labels:
        if not LABEL_KEY.match(key):
            raise f.fail("labels", f"key '{key[:40]}' may use only letters, digits and _.-/")
    regex = f.str_("progress_regex", None, 1024)
    if regex is not None:
        import regex as regex_module  # the daemon's matcher; the CLI never gets here

        try:
            regex_module.compile(regex)
        except regex_module.error as exc:
            raise f.fail("progress_regex", f"not a valid regular expression: {exc}") from None
    return SubmitOptions(
        cwd=cwd,
        env=env,
        name=f.str_("name", "", MAX_NAME) or "",
        labels=labels,
        gpus=f.int_("gpus", 1, 0, MAX_GPUS) or 0,
        vram_mb=f.int_("vram_mb", None, 1, MAX_SIZE_MB),
        mem_mb=f.int_("mem_mb", None, 1, MAX_SIZE_MB),
        mem_key=f.str_("mem_key", None, 256),
        mem_scale=f.float_("mem_scale", MIN_SCALE, MAX_SCALE),
        retries=f.int_("retries", None, 0, MAX_RETRIES),
        gpu_hang_retries=f.int_("gpu_hang_retries", None, 0, MAX_RETRIES),
        progress_timeout_s=f.float_("progress_timeout_s", 0, 365 * 86400),
        progress_regex=regex,
        priority=f.int_("priority", 0, -1_000_000, 1_000_000) or 0,
        after=tuple(f.int_list("after", 1000)),
        after_any=tuple(f.int_list("after_any", 1000)),
        dry_run=f.bool_("dry_run"),
        request_id=_request_id(f),
        time_limit_s=f.float_("time_limit_s", 1e-3, MAX_DURATION_S),
        run=f.bool_("run"),
        stall_timeout_s=f.float_("stall_timeout_s", 0, 365 * 86400),
        share=f.bool_("share"),
        array=_array_indices(f),
        max_running=f.int_("max_running", None, 1, MAX_BATCH),
        cards=_nonempty(f, "cards"),
        not_cards=_nonempty(f, "not_cards"),
    )


def _nonempty(f: _Fields, key: str) -> tuple[int, ...] | None:
    cards = f.card_list(key, MAX_GPUS - 1)
    if cards == ():
        raise f.fail(key, "must name at least one card")
    return cards


def _request_id(f: _Fields) -> str | None:
    value = f.str_("request_id", None, MAX_REQUEST_ID)
    if value is not None and not value.strip():
        raise f.fail("request_id", "must not be empty")
    return value


def _array_indices(f: _Fields) -> tuple[int, ...]:
    value = f._get("array")
    if value is None:
        return ()
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_BATCH:
        raise f.fail("array", f"must be a list of 1 to {MAX_BATCH} indices")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= MAX_ID:
            raise f.fail("array", "indices are integers from 0 that fit 63 bits")
    if len(set(value)) != len(value):
        raise f.fail("array", "an index appears twice")
    return tuple(value)


def _parse_submit(f: _Fields, batch: bool) -> Submit:
    if batch:
        raw = f._get("argvs")
        if not isinstance(raw, list) or not raw:
            raise f.fail("argvs", "must be a non-empty list of commands")
        if len(raw) > MAX_BATCH:
            raise f.fail("argvs", f"more than {MAX_BATCH} commands")
        argvs = [_str_list(a, "argvs[]", MAX_ARGV, MAX_ARG_BYTES) for a in raw]
    else:
        argv = f.str_list("argv", MAX_ARGV, MAX_ARG_BYTES)
        if argv is None:
            raise f.fail("argv", "is required")
        argvs = [argv]
    for argv in argvs:
        if not argv or not argv[0]:
            raise ProtocolError(BAD_REQUEST, "a command must have a non-empty program name")
    names = f.str_list("names", MAX_BATCH, MAX_NAME) if batch else None
    if names is not None and len(names) != len(argvs):
        raise f.fail("names", "must name each command of argvs, in order")
    options = _submit_options(f)
    if options.run and (batch or options.array):
        raise f.fail("run", "is for one command, not a batch or an array")
    f.done()
    if options.array:
        if batch:
            raise f.fail("array", "an array repeats one command; a batch has its own")
        argvs = argvs * len(options.array)
    names_ = tuple(names) if names is not None else None
    return Submit(argvs=tuple(tuple(a) for a in argvs), options=options, names=names_)


def _parse_ref(kind: str, f: _Fields) -> JobRef:
    ids = f.int_list("ids", 10_000)
    every = f.bool_("all") if kind == "cancel" else False
    if every and ids:
        raise f.fail("all", "give ids or all, not both")
    if not ids and not every:
        raise f.fail("ids", "at least one job id is required")
    if kind in ("show", "logs") and len(ids) != 1:
        raise f.fail("ids", f"{kind} takes exactly one id")
    timeout = f.float_("timeout_s", 0, 10 * 365 * 86400) if kind in ("wait", "logs") else None
    stream, offset, follow, tail = "stdout", 0, False, None
    if kind == "logs":
        tail = f.int_("tail_lines", None, 0, MAX_ID)
        stream = f.str_("stream", "stdout", 10) or "stdout"
        if stream not in ("stdout", "stderr", "both"):
            raise f.fail("stream", "must be 'stdout', 'stderr' or 'both'")
        offset = f.int_("offset", 0, 0, MAX_ID) or 0
        follow = f.bool_("follow")
    f.done()
    return JobRef(kind, tuple(ids), timeout, stream, offset, follow, tail, every)


def parse_request(obj: dict[str, Any]) -> Request:
    """A decoded JSON object -> a typed request, or ProtocolError naming what is wrong."""
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(BAD_REQUEST, "field 'type': a string is required")
    version = obj.get("version", VERSION)
    if type(version) is not int or version != VERSION:
        raise ProtocolError(BAD_REQUEST, f"unsupported protocol version {str(version)[:40]!r}")
    f = _Fields(obj)
    if kind in ("submit", "submit_batch"):
        return _parse_submit(f, batch=kind == "submit_batch")
    if kind == "list":
        states = f.str_list("states", 5, 16) or []
        for state in states:
            if state not in STATES:
                raise f.fail("states", f"unknown state '{state}'")
        limit = f.int_("limit", 1000, 1, MAX_LIST) or 1000
        before = f.int_("before_id", None, 1, MAX_ID)
        owner = f.int_("owner_uid", None, 0, 2**32 - 1)
        recent = f.float_("recent_s", 0, MAX_DURATION_S)
        array = f.int_("array", None, 1, MAX_ID)
        name = f.str_("name", None, MAX_NAME)
        labels = f.str_map("labels", MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE)
        f.done()
        return ListJobs(
            tuple(states),
            limit,
            before,
            owner_uid=owner,
            recent_s=recent,
            array=array,
            name=name,
            labels=tuple(sorted(labels.items())),
        )
    if kind == "restart_array":
        array = f.req_int("array", 1, MAX_ID)
        f.done()
        return ArrayRef(kind, array)
    if kind in REF_TYPES:
        return _parse_ref(kind, f)
    if kind == "update":
        return parse_update(f, MAX_GPUS - 1)
    if kind == "clean":
        older = f.float_("older_than_s", 0, MAX_DURATION_S) or 0.0
        f.done()
        return Clean(older)
    if kind in SIMPLE_TYPES:
        f.done()
        return Simple(kind)
    raise ProtocolError(UNKNOWN_TYPE, f"unknown request type '{kind[:40]}'")


def decode_request(raw: bytes) -> Request:
    return parse_request(decode_line(raw))
