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

from supervisor.wire.framing import MAX_LINE as MAX_LINE  # re-exported: the framing is protocol too
from supervisor.wire.framing import VERSION as VERSION
from supervisor.wire.framing import encode as encode

MAX_ARGV = 4096
MAX_ARG_BYTES = 128 * 1024
MAX_ENV = 4096
MAX_ENV_BYTES = 512 * 1024
MAX_LABELS = 64
MAX_LABEL_KEY = 64
MAX_LABEL_VALUE = 1024
MAX_NAME = 256
MAX_GPUS = 64
MAX_ID = 2**63 - 1
MAX_BATCH = 100_000
MAX_RETRIES = 10_000
MAX_SIZE_MB = 2**40  # a petabyte: anything larger is a typo
MAX_LIST = 10_000
# A scale is a ratio the projection divides by and extrapolates with: positive, and
# bounded so that no projection overflows.
MIN_SCALE, MAX_SCALE = 1e-6, 1e12
LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]+$")
# Only a \uD800-\uDFFF escape can put a surrogate into decoded text (raw UTF-8 cannot).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

# Error codes: stable strings that clients may branch on.
BAD_JSON = "bad_json"
BAD_REQUEST = "bad_request"
UNKNOWN_TYPE = "unknown_type"
TOO_LARGE = "too_large"
NOT_FOUND = "not_found"
FORBIDDEN = "forbidden"
BUSY = "busy"
LIMIT = "limit"
DRAINING = "draining"
INVALID_STATE = "invalid_state"
INTERNAL = "internal"
STORAGE = "storage"  # the daemon could not record the request (disk full, ...): nothing done


class ProtocolError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"ok": False, "error": {"code": self.code, "message": self.message}}


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


# ---- field validation -------------------------------------------------------------------


class _Fields:
    """Reads typed fields out of a request object and rejects anything left over."""

    def __init__(self, obj: dict[str, Any], where: str = "") -> None:
        self.obj = obj
        self.seen: set[str] = {"type", "version"} if not where else set()
        self.where = where

    def _name(self, key: str) -> str:
        return f"{self.where}{key}"

    def _get(self, key: str) -> Any:
        self.seen.add(key)
        return self.obj.get(key)

    def fail(self, key: str, why: str) -> ProtocolError:
        return ProtocolError(BAD_REQUEST, f"field '{self._name(key)}': {why}")

    def int_(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        return value

    def req_int(self, key: str, lo: int, hi: int) -> int:
        value = self.int_(key, None, lo, hi)
        if value is None:
            raise self.fail(key, "is required")
        return value

    def float_(self, key: str, lo: float, hi: float) -> float | None:
        value = self._get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        return float(value)

    def bool_(self, key: str) -> bool:
        value = self._get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(key, "must be true or false")
        return value

    def str_(self, key: str, default: str | None, max_len: int) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {type(value).__name__}")
        if len(value) > max_len:
            raise self.fail(key, f"longer than {max_len} characters")
        if "\x00" in value:
            raise self.fail(key, "contains a NUL character")
        return value

    def str_list(self, key: str, max_items: int, max_len: int) -> list[str] | None:
        value = self._get(key)
        if value is None:
            return None
        return _str_list(value, self._name(key), max_items, max_len)

    def str_map(self, key: str, max_items: int, max_key: int, max_value: int) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, "must be an object of strings")
        if len(value) > max_items:
            raise self.fail(key, f"more than {max_items} entries")
        for k, v in value.items():
            if not isinstance(v, str) or len(k) > max_key or len(v) > max_value:
                raise self.fail(key, f"entry '{k[:40]}' must be a string of at most {max_value}")
            if "\x00" in k or "\x00" in v:
                raise self.fail(key, f"entry '{k[:40]}' contains a NUL character")
        return dict(value)

    def int_list(self, key: str, max_items: int) -> list[int]:
        value = self._get(key)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise self.fail(key, f"must be a list of at most {max_items} ids")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= MAX_ID:
                raise self.fail(key, "ids are positive integers that fit 63 bits")
        return list(value)

    def done(self) -> None:
        extra = sorted(set(self.obj) - self.seen)
        if extra:
            raise ProtocolError(BAD_REQUEST, f"unknown field '{self._name(extra[0])}'")


def _str_list(value: Any, name: str, max_items: int, max_len: int) -> list[str]:
    if not isinstance(value, list):
        raise ProtocolError(BAD_REQUEST, f"field '{name}': must be a list of strings")
    if len(value) > max_items:
        raise ProtocolError(BAD_REQUEST, f"field '{name}': more than {max_items} items")
    for item in value:
        if not isinstance(item, str):
            raise ProtocolError(BAD_REQUEST, f"field '{name}': items must be strings")
        if len(item) > max_len or "\x00" in item:
            raise ProtocolError(BAD_REQUEST, f"field '{name}': item too long or has NUL")
    return list(value)


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
    dry_run: bool = False
    stall_timeout_s: float | None = None
    share: bool = False
    array: tuple[int, ...] = ()  # one job per index, of one new array
    max_running: int | None = None  # of the array (or the batch) at most this many at once


@dataclass(frozen=True)
class Submit:
    """One command (``argvs`` of one) or a batch; all share the options."""

    argvs: tuple[tuple[str, ...], ...]
    options: SubmitOptions
    type: str = "submit"


@dataclass(frozen=True)
class ListJobs:
    states: tuple[str, ...] = ()
    limit: int = 1000
    before_id: int | None = None
    type: str = "list"
    array: int | None = None  # only the jobs of this array


@dataclass(frozen=True)
class JobRef:
    """show, cancel, wait and logs all name jobs by id."""

    type: str
    ids: tuple[int, ...]
    timeout_s: float | None = None
    stream: str = "stdout"
    offset: int = 0
    follow: bool = False


@dataclass(frozen=True)
class Simple:
    """ping, gpus, stats, health, metrics, top: no arguments."""

    type: str


@dataclass(frozen=True)
class ArrayRef:
    """restart_array: the failed indices of an array, submitted again."""

    type: str
    array: int


Request = Submit | ListJobs | JobRef | Simple | ArrayRef
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
SIMPLE_TYPES = ("ping", "gpus", "stats", "health", "metrics", "top")


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
        dry_run=f.bool_("dry_run"),
        stall_timeout_s=f.float_("stall_timeout_s", 0, 365 * 86400),
        share=f.bool_("share"),
        array=_array_indices(f),
        max_running=f.int_("max_running", None, 1, MAX_BATCH),
    )


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
    options = _submit_options(f)
    f.done()
    if options.array:
        if batch:
            raise f.fail("array", "an array repeats one command; a batch has its own")
        argvs = argvs * len(options.array)
    return Submit(argvs=tuple(tuple(a) for a in argvs), options=options)


def _parse_ref(kind: str, f: _Fields) -> JobRef:
    ids = f.int_list("ids", 10_000)
    if not ids:
        raise f.fail("ids", "at least one job id is required")
    if kind in ("show", "logs") and len(ids) != 1:
        raise f.fail("ids", f"{kind} takes exactly one id")
    timeout = f.float_("timeout_s", 0, 10 * 365 * 86400) if kind in ("wait", "logs") else None
    stream, offset, follow = "stdout", 0, False
    if kind == "logs":
        stream = f.str_("stream", "stdout", 10) or "stdout"
        if stream not in ("stdout", "stderr"):
            raise f.fail("stream", "must be 'stdout' or 'stderr'")
        offset = f.int_("offset", 0, 0, MAX_ID) or 0
        follow = f.bool_("follow")
    f.done()
    return JobRef(kind, tuple(ids), timeout, stream, offset, follow)


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
        array = f.int_("array", None, 1, MAX_ID)
        f.done()
        return ListJobs(tuple(states), limit, before, array=array)
    if kind == "restart_array":
        array = f.req_int("array", 1, MAX_ID)
        f.done()
        return ArrayRef(kind, array)
    if kind in ("show", "cancel", "wait", "logs"):
        return _parse_ref(kind, f)
    if kind in SIMPLE_TYPES:
        f.done()
        return Simple(kind)
    raise ProtocolError(UNKNOWN_TYPE, f"unknown request type '{kind[:40]}'")


def decode_request(raw: bytes) -> Request:
    return parse_request(decode_line(raw))
