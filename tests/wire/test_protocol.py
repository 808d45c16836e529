"""Tests for supervisor.wire.protocol: framing, validation, and fuzzing of decode_request."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.wire import protocol
from supervisor.wire.protocol import JobRef, ListJobs, ProtocolError, Simple, Submit

# What decode_request may answer; anything else (not_found, forbidden...) is the API's.
DECODE_CODES = {protocol.BAD_JSON, protocol.BAD_REQUEST, protocol.UNKNOWN_TYPE, protocol.TOO_LARGE}
TYPES = ("submit", "submit_batch", "list", "show", "cancel", "wait", "logs", *protocol.SIMPLE_TYPES)
FIELDS = [
    "argv",
    "argvs",
    "cwd",
    "env",
    "name",
    "labels",
    "gpus",
    "vram_mb",
    "mem_mb",
    "mem_key",
    "mem_scale",
    "retries",
    "gpu_hang_retries",
    "progress_timeout_s",
    "progress_regex",
    "priority",
    "after",
    "dry_run",
    "states",
    "limit",
    "before_id",
    "ids",
    "timeout_s",
    "stream",
    "offset",
    "follow",
    "version",
    "owner_uid",
]


def submit(**fields: Any) -> dict[str, Any]:
    return {"type": "submit", "argv": ["true"], "cwd": "/tmp", **fields}


def refused(obj: dict[str, Any] | bytes) -> ProtocolError:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(ProtocolError) as info:
        protocol.decode_request(raw)
    return info.value


def test_a_valid_submit_is_typed() -> None:
    req = protocol.decode_request(
        json.dumps(submit(env={"A": "1"}, labels={"team/x": "y"}, gpus=0, after=[3])).encode()
    )
    assert isinstance(req, Submit)
    assert req.argvs == (("true",),)
    assert req.options.env == {"A": "1"} and req.options.gpus == 0 and req.options.after == (3,)
    small = protocol.decode_request(json.dumps(submit(mem_scale=protocol.MIN_SCALE)).encode())
    assert isinstance(small, Submit) and small.options.mem_scale == protocol.MIN_SCALE


@pytest.mark.parametrize("claim", ["owner_uid", "uid", "gid", "pid", "user"])
def test_identity_claims_are_unknown_fields(claim: str) -> None:
    err = refused(submit(**{claim: 0}))
    assert err.code == protocol.BAD_REQUEST
    assert f"unknown field '{claim}'" in err.message


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", protocol.BAD_JSON),
        (b"not json", protocol.BAD_JSON),
        (b'{"type": "ping"', protocol.BAD_JSON),
        (b"\xff\xfe{}", protocol.BAD_JSON),  # not UTF-8
        (b'{"type": "\\ud800"}', protocol.BAD_JSON),  # a lone surrogate is not Unicode
        (b'{"type": "ping", "version": NaN}', protocol.BAD_JSON),
        (b'{"type": "wait", "ids": [1], "timeout_s": Infinity}', protocol.BAD_JSON),
        (b"[" * 100_000 + b"]" * 100_000, protocol.BAD_JSON),  # nesting: RecursionError
        (b'{"ids": [' + b"9" * 5000 + b"]}", protocol.BAD_JSON),  # int beyond 4300 digits
        (b"[]", protocol.BAD_REQUEST),
        (b'"ping"', protocol.BAD_REQUEST),
        (b"{}", protocol.BAD_REQUEST),
        (b'{"type": 1}', protocol.BAD_REQUEST),
        (b'{"type": "reboot"}', protocol.UNKNOWN_TYPE),
        (b'{"type": "ping", "version": 2}', protocol.BAD_REQUEST),
        (b'{"type": "ping", "version": true}', protocol.BAD_REQUEST),
        (b'{"type": "ping", "extra": 1}', protocol.BAD_REQUEST),
    ],
)
def test_malformed_lines_get_typed_errors(raw: bytes, code: str) -> None:
    assert refused(raw).code == code


def test_a_line_over_the_limit_is_too_large_and_one_at_it_is_read() -> None:
    pad = b" " * (protocol.MAX_LINE - len(b'{"type":"ping"}'))
    assert protocol.decode_request(b'{"type":"ping"}' + pad) == Simple("ping")
    assert refused(b'{"type":"ping"}' + pad + b" ").code == protocol.TOO_LARGE


@pytest.mark.parametrize(
    "fields",
    [
        {"gpus": -1},
        {"gpus": 65},
        {"gpus": 1.0},  # no floats where integers go
        {"gpus": "1"},
        {"gpus": True},
        {"vram_mb": 0},
        {"mem_mb": 2**40 + 1},
        {"retries": 10_001},
        {"priority": 2**63},
        {"after": [0]},
        {"after": [2**63]},  # ids fit 63 bits
        {"after": [1.5]},
        {"after": "1"},
        {"mem_scale": "2"},
        {"mem_scale": 0},  # the projection divides by scales
        {"mem_scale": -2.5},
        {"mem_scale": 1e13},
        {"progress_timeout_s": -1},
        {"progress_regex": "("},
        {"cwd": "relative/dir"},
        {"cwd": ""},
        {"argv": []},
        {"argv": [""]},
        {"argv": "true"},
        {"argv": ["a", 1]},
        {"argv": ["a\x00b"]},
        {"argv": ["x"] * (protocol.MAX_ARGV + 1)},
        {"argv": ["x" * (protocol.MAX_ARG_BYTES + 1)]},
        {"name": "n" * (protocol.MAX_NAME + 1)},
        {"name": "a\x00"},
        {"name": 7},
        {"env": ["A=1"]},
        {"env": {"A": 1}},
        {"env": {"A=B": "1"}},
        {"env": {"": "1"}},
        {"env": {"A\x00": "1"}},
        {"env": {f"V{i}": "" for i in range(protocol.MAX_ENV + 1)}},
        {"env": {f"V{i}": "x" * 100_000 for i in range(6)}},  # over 512 KiB in all
        {"labels": {"bad key": "v"}},
        {"labels": {f"k{i}": "v" for i in range(protocol.MAX_LABELS + 1)}},
        {"labels": {"k": "v" * (protocol.MAX_LABEL_VALUE + 1)}},
        {"dry_run": "yes"},
    ],
)
def test_bad_submit_fields_are_bad_request(fields: dict[str, Any]) -> None:
    err = refused(submit(**fields))
    assert err.code == protocol.BAD_REQUEST, err.message


def test_the_error_names_the_field() -> None:
    assert "'gpus'" in refused(submit(gpus=1.5)).message
    assert "'argv'" in refused({"type": "submit", "cwd": "/"}).message
    assert "'cwd'" in refused({"type": "submit", "argv": ["x"]}).message


def test_a_batch_with_one_bad_command_is_refused_whole() -> None:
    err = refused({"type": "submit_batch", "argvs": [["true"], [], ["true"]], "cwd": "/"})
    assert err.code == protocol.BAD_REQUEST
    assert refused({"type": "submit_batch", "argvs": [["true"], [3]], "cwd": "/"})


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "show", "ids": []},
        {"type": "show", "ids": [1, 2]},
        {"type": "cancel", "ids": [-1]},
        {"type": "cancel", "ids": [2**63]},
        {"type": "cancel", "ids": [True]},
        {"type": "logs", "ids": [1], "stream": "stdin"},
        {"type": "logs", "ids": [1], "offset": -1},
        {"type": "wait", "ids": [1], "timeout_s": -1},
        {"type": "list", "states": ["zombie"]},
        {"type": "list", "limit": 0},
        {"type": "list", "limit": protocol.MAX_LIST + 1},
        {"type": "ping", "ids": [1]},
    ],
)
def test_bad_reference_requests_are_bad_request(obj: dict[str, Any]) -> None:
    assert refused(obj).code == protocol.BAD_REQUEST


def test_reference_requests_parse() -> None:
    req = protocol.decode_request(b'{"type":"logs","ids":[9],"stream":"stderr","offset":5}')
    assert req == JobRef("logs", (9,), None, "stderr", 5, False)
    assert protocol.decode_request(b'{"type":"cancel","ids":[9223372036854775807]}') == JobRef(
        "cancel", (2**63 - 1,)
    )
    assert protocol.decode_request(b'{"type":"list","states":["queued"]}') == ListJobs(("queued",))


def test_encode_never_raises_and_a_surrogate_comes_back_refused() -> None:
    line = protocol.encode({"type": "submit", "argv": ["cat", "\udcff"], "cwd": "/"})
    assert line.endswith(b"\n")
    assert refused(line[:-1]).code == protocol.BAD_JSON


# ---- fuzzing ---------------------------------------------------------------------------

ANY_CHAR = st.characters(exclude_categories=())  # surrogates and NUL included
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(ANY_CHAR, max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_decodes_or_refuses(raw: bytes) -> None:
    try:
        req = protocol.decode_request(raw)
    except ProtocolError as exc:
        assert exc.code in DECODE_CODES, exc.code
        assert exc.message
        protocol.encode(exc.to_json())  # every refusal can be sent back
        return
    assert isinstance(req, Submit | ListJobs | JobRef | Simple)
    # What was accepted can be stored (SQLite text), executed and echoed back.
    json.dumps(dataclasses.asdict(req), ensure_ascii=False).encode("utf-8")


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused(raw: bytes) -> None:
    check_decodes_or_refuses(raw)


@FUZZ
@given(JSON)
def test_any_json_value_decodes_or_is_refused(value: Any) -> None:
    check_decodes_or_refuses(json.dumps(value).encode())


@FUZZ
@given(
    st.sampled_from(TYPES),
    st.dictionaries(st.sampled_from(FIELDS), JSON | st.lists(st.text(max_size=5)), max_size=6),
)
def test_wrong_fields_of_a_known_type_are_refused_typed(kind: str, fields: dict[str, Any]) -> None:
    check_decodes_or_refuses(json.dumps({**fields, "type": kind}).encode())


@FUZZ
@given(st.text(ANY_CHAR, max_size=30), st.text(ANY_CHAR, max_size=30))
def test_any_text_in_argv_and_name_is_refused_or_kept_exactly(arg: str, name: str) -> None:
    raw = protocol.encode(submit(argv=["x", arg], name=name))[:-1]
    try:
        req = protocol.decode_request(raw)
    except ProtocolError as exc:
        assert exc.code in (protocol.BAD_JSON, protocol.BAD_REQUEST)
        assert "\x00" in arg + name or any(0xD800 <= ord(c) <= 0xDFFF for c in arg + name)
        return
    assert isinstance(req, Submit)
    assert req.argvs == (("x", arg),) and req.options.name == name
    (arg + name).encode("utf-8")  # storable and executable
