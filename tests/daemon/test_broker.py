"""The event broker: subscribers in order, and each isolated: one that raises is logged
with the event's type and its own name, counted, and the next one still called."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
from structlog.testing import capture_logs

from supervisor.daemon.broker import Broker


@dataclass(frozen=True)
class Ping:
    job_id: int


@dataclass(frozen=True)
class Pong:
    pass


def test_subscribers_are_called_in_order_for_their_kind_only() -> None:
    broker = Broker()
    seen: list[str] = []
    broker.subscribe(Ping, lambda ev: seen.append(f"a{ev.job_id}"))
    broker.subscribe(Pong, lambda ev: seen.append("pong"))
    broker.subscribe(Ping, lambda ev: seen.append(f"b{ev.job_id}"))
    broker.publish(Ping(1))
    assert seen == ["a1", "b1"]
    assert broker.failures == {}


def test_a_listener_that_raises_is_logged_counted_and_the_rest_still_run() -> None:
    broker = Broker()
    seen: list[Ping] = []

    def faulty(ev: Ping) -> None:
        raise RuntimeError(f"bug on {ev.job_id}")

    broker.subscribe(Ping, seen.append)
    broker.subscribe(Ping, faulty)
    broker.subscribe(Ping, seen.append)
    with capture_logs() as logged:
        broker.publish(Ping(7))  # does not raise
        broker.publish(Ping(8))
    assert seen == [Ping(7), Ping(7), Ping(8), Ping(8)]
    assert broker.failures == {"Ping": 2}
    first = logged[0]
    assert first["event"] == "listener failed" and first["log_level"] == "error"
    assert first["event_type"] == "Ping" and first["job_id"] == 7
    assert first["listener"].endswith("faulty")
    assert first["exc_info"] is True  # the traceback goes with it
    assert len(logged) == 2


async def test_a_stream_subscriber_gets_the_events_from_now_on() -> None:
    broker = Broker()
    broker.publish(Ping(1))
    stream = broker.stream(Ping, Pong)
    broker.publish(Ping(2))
    broker.publish(Pong())
    with anyio.fail_after(10):
        assert [await stream.receive(), await stream.receive()] == [Ping(2), Pong()]
    stream.close()
    with capture_logs() as logged:
        broker.publish(Ping(3))  # its reader is gone: counted, not raised
    assert broker.failures == {"Ping": 1}
    assert logged[0]["listener"].endswith("send_nowait")
