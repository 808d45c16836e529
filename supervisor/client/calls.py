"""The requests the CLI sends, each with its reply, as the wire's shapes: mypy checks the
CLI's reads against the same types the daemon builds its replies with. The shapes are
imported only for the type checker, so the CLI starts as fast as before."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from supervisor.client.connection import Client

if TYPE_CHECKING:
    from supervisor.wire.shapes import (
        CancelReply,
        JobJson,
        JobRefRequest,
        ListReply,
        ListRequest,
        LogsReply,
        SubmitReply,
        SubmitRequest,
        WaitReply,
    )


def _call(client: Client, request: Any) -> Any:
    return client.call(dict(request))


def submit(client: Client, request: SubmitRequest) -> SubmitReply:
    return cast("SubmitReply", _call(client, request))


def list_jobs(client: Client, states: list[str], limit: int, array: int | None) -> ListReply:
    request: ListRequest = {"type": "list", "states": states, "limit": limit}
    if array is not None:
        request["array"] = array
    return cast("ListReply", _call(client, request))


def show(client: Client, job_id: int) -> JobJson:
    request: JobRefRequest = {"type": "show", "ids": [job_id]}
    return cast("JobJson", _call(client, request)["job"])


def logs(client: Client, job_id: int, stream: str, offset: int) -> LogsReply:
    request: JobRefRequest = {"type": "logs", "ids": [job_id], "offset": offset}
    request["stream"] = "stderr" if stream == "stderr" else "stdout"
    return cast("LogsReply", _call(client, request))


def cancel(client: Client, ids: list[int]) -> CancelReply:
    request: JobRefRequest = {"type": "cancel", "ids": ids}
    return cast("CancelReply", _call(client, request))


def wait(client: Client, ids: list[int], timeout_s: float | None) -> WaitReply:
    request: JobRefRequest = {"type": "wait", "ids": ids}
    if timeout_s is not None:
        request["timeout_s"] = timeout_s
    return cast("WaitReply", _call(client, request))
