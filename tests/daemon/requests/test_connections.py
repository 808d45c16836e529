"""Room for a newcomer: made by closing the longest-idle connection of the user at its
cap, or of the biggest holder at the daemon's cap; refused only when none is idle."""

from __future__ import annotations

import anyio

from supervisor.daemon.requests.connections import EVICT_IDLE_S, Connections, Held

NOW = 1000.0


def held(serial: int, uid: int, idle_for: float | None) -> Held:
    since = None if idle_for is None else NOW - idle_for
    return Held(serial, uid, anyio.CancelScope(), since)


def book(
    *conns: Held, total: int = 4, per_user: int = 2, kept: frozenset[int] = frozenset()
) -> Connections:
    c = Connections(total, per_user, lambda serial: serial in kept)
    for h in conns:
        c.add(h)
    return c


async def test_a_user_at_its_cap_gives_up_its_longest_idle_connection() -> None:
    a, b, other = held(1, 100, 5.0), held(2, 100, 9.0), held(3, 200, 50.0)
    c = book(a, b, other)
    assert c.room_for(100, NOW) is None
    assert b.scope.cancel_called and not a.scope.cancel_called and not other.scope.cancel_called
    assert sorted(c.held) == [1, 3] and c.by_uid == {100: 1, 200: 1}


async def test_a_user_whose_connections_are_all_busy_or_just_idle_is_refused() -> None:
    c = book(held(1, 100, None), held(2, 100, EVICT_IDLE_S / 2))
    why = c.room_for(100, NOW)
    assert why == "uid 100 holds its limit of 2 connections to gpusvd, none of them idle; retry"
    assert sorted(c.held) == [1, 2]


async def test_at_the_daemons_cap_the_biggest_holder_gives_way() -> None:
    small = held(1, 100, 60.0)  # the longest idle of all, but its user holds one
    big = [held(2, 200, 3.0), held(3, 200, 4.0), held(4, 200, None)]
    c = book(small, *big, total=4, per_user=3)
    assert c.room_for(300, NOW) is None
    assert big[1].scope.cancel_called and not small.scope.cancel_called
    assert c.by_uid == {100: 1, 200: 2}


async def test_the_biggest_holder_with_nothing_idle_passes_the_turn_to_the_next() -> None:
    c = book(held(1, 100, 2.0), held(2, 200, None), held(3, 200, None), total=3, per_user=3)
    assert c.room_for(300, NOW) is None and sorted(c.held) == [2, 3]


async def test_kept_connections_are_never_given_up_and_at_last_a_newcomer_is_refused() -> None:
    c = book(held(1, 100, 30.0), held(2, 200, None), total=2, per_user=2, kept=frozenset({1}))
    assert c.room_for(300, NOW) == "gpusvd is serving its limit of 2 connections, none idle; retry"
    assert sorted(c.held) == [1, 2]


async def test_a_release_counts_once() -> None:
    h = held(1, 100, None)
    c = book(h)
    c.release(1)
    c.release(1)
    assert not c.held and not c.by_uid
