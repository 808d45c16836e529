"""The policy of riding through a restart: which requests go again, the backoff, the bound."""

from __future__ import annotations

import pytest

from supervisor.client import reconnect
from supervisor.wire.sizes import ConfigError


@pytest.mark.parametrize(
    ("request_", "again"),
    [
        ({"type": "list"}, True),
        ({"type": "logs", "ids": [1], "offset": 10}, True),
        ({"type": "wait", "ids": [1]}, True),
        ({"type": "cancel", "ids": [1]}, True),
        ({"type": "submit", "argv": ["true"], "request_id": "r"}, True),
        ({"type": "submit_batch", "argvs": [["true"]], "request_id": "r"}, True),
        ({"type": "submit", "argv": ["true"], "dry_run": True}, True),
        ({"type": "submit", "argv": ["true"]}, False),
        ({"type": "restart", "ids": [1]}, False),
        ({"type": "restart_array", "array": 1}, False),
    ],
)
def test_only_requests_a_repeat_cannot_do_twice_go_again(
    request_: dict[str, object], again: bool
) -> None:
    assert reconnect.may_send_again(request_) is again


def test_the_backoff_doubles_to_its_ceiling() -> None:
    assert reconnect.pauses(0.1, 2.0) == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


def test_the_bound_comes_from_the_flag_then_the_environment_then_60_s() -> None:
    env = {"GPUSV_CONNECT_TIMEOUT": "5m"}
    assert reconnect.connect_timeout("2", env) == 2.0
    assert reconnect.connect_timeout(None, env) == 300.0
    assert reconnect.connect_timeout(None, {}) == 60.0
    with pytest.raises(ConfigError, match="GPUSV_CONNECT_TIMEOUT"):
        reconnect.connect_timeout(None, {"GPUSV_CONNECT_TIMEOUT": "soon"})


def test_a_wait_sent_again_keeps_its_own_timeout() -> None:
    request = {"type": "wait", "ids": [1], "timeout_s": 10.0}
    patience = reconnect.Patience(60.0, None, request)
    assert patience.again(request, 4.0)["timeout_s"] == 6.0
    assert patience.again(request, 40.0)["timeout_s"] == 0.0
    plain = {"type": "wait", "ids": [1]}
    assert reconnect.Patience(60.0, None, plain).again(plain, 4.0) == plain


def test_the_system_unit_is_asked_only_for_the_system_socket() -> None:
    assert not reconnect.unit_activating(["/tmp/nowhere/gpusvd.sock"])


def test_a_submit_given_up_on_names_its_request_id() -> None:
    text = reconnect.gone_message(["/s (refused)"], 60.0, {"type": "submit", "request_id": "abc"})
    assert text.startswith("gpusvd did not come back within 60 s: tried /s (refused)")
    assert "--request-id abc" in text


def test_a_missing_socket_is_looked_at_once_more_only_after_a_refusal() -> None:
    fresh = reconnect.Patience(60.0, None, {"type": "list"})
    assert not fresh.in_the_gap(sent=False)  # never saw a daemon: no socket is no daemon
    seen = reconnect.Patience(60.0, None, {"type": "list"})
    assert seen.in_the_gap(sent=True)
    assert not seen.in_the_gap(sent=True)  # the second time, the daemon was stopped
