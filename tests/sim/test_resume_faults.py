"""Resumable subscription and idempotent sends against the sim with injected faults: no event lost,
none delivered twice, server order kept."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx

from pipeline.session import Preview, RetryPolicy, ServerEvent, SessionClient
from pipeline.sim import SimServer

from .conftest import make_client
from .helpers import segments_text, system_message, user_message


async def _set_faults(sim: SimServer, **faults: Any) -> None:
    async with httpx.AsyncClient(base_url=sim.root_url) as http:
        response = await http.post("/_sim/faults", json=faults)
        assert response.status_code == 200


async def _drive_turns(
    client: SessionClient, sid: str, turns: int, *, deltas: bool = False
) -> tuple[list[ServerEvent], int]:
    """Send a message, wait for its idle on the subscription, repeat; returns what the subscription saw."""
    seen: list[ServerEvent] = []
    subscription = client.subscribe(sid, deltas=deltas, reconnect_base=0.01, reconnect_max=0.05)
    await client.send(sid, [user_message("turn 0 [sim:deltas]", "msg-0"), system_message()])
    sent = 1
    async for item in subscription:
        if isinstance(item, Preview):
            continue
        seen.append(item)
        if item.type == "session.status_idle":
            if sent == turns:
                break
            await client.send(sid, [user_message(f"turn {sent} [sim:deltas]", f"msg-{sent}"), system_message()])
            sent += 1
    return seen, subscription.reconnects


def _assert_exactly_history(seen: list[ServerEvent], history: list[ServerEvent]) -> None:
    ids = [e.id for e in seen]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    assert ids == [e.id for e in history], "events lost or reordered"


async def test_subscription_survives_random_stream_drops(sim: SimServer) -> None:
    await _set_faults(sim, drop_stream_prob=0.15, seed=3)
    sid = await sim.create_session()
    async with make_client(sim, "ark") as client:
        seen, reconnects = await asyncio.wait_for(_drive_turns(client, sid, 12, deltas=True), 30)
        await _set_faults(sim, drop_stream_prob=0.0)
        history = [e async for e in client.list(sid)]
    assert reconnects > 3
    _assert_exactly_history(seen, history)
    replies = [segments_text(e.text) for e in seen if e.type == "agent.message"]  # type: ignore[union-attr]
    assert replies == [f"echo: turn {n}" for n in range(12)]


async def test_subscription_with_drops_and_flaky_sends(sim: SimServer) -> None:
    await _set_faults(sim, drop_stream_prob=0.1, rate_500=0.25, rate_429=0.25, retry_after=0.01, seed=11)
    sid = await sim.create_session()
    async with make_client(
        sim, "anthropic", retry=RetryPolicy(max_attempts=12, base_delay=0.005, max_delay=0.02)
    ) as client:
        seen, _ = await asyncio.wait_for(_drive_turns(client, sid, 8), 30)
        await _set_faults(sim, drop_stream_prob=0.0, rate_500=0.0, rate_429=0.0)
        history = [e async for e in client.list(sid)]
    _assert_exactly_history(seen, history)
    user_ids = Counter(e.id for e in history if e.type == "user.message")
    assert user_ids == Counter({f"msg-{n}": 1 for n in range(8)})
    async with httpx.AsyncClient(base_url=sim.root_url) as http:
        stats = (await http.get("/_sim/stats")).json()
    assert stats["injected_500"] > 0 and stats["injected_429"] > 0 and stats["streams_dropped"] > 0


async def test_explicit_drop_mid_turn(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    seen: list[ServerEvent] = []
    subscription = ark.subscribe(sid, reconnect_base=0.01)

    first_event = asyncio.Event()

    async def consume() -> None:
        async for item in subscription:
            assert not isinstance(item, Preview)
            seen.append(item)
            first_event.set()
            if item.type == "session.status_idle":
                return

    task = asyncio.create_task(consume())
    async with httpx.AsyncClient(base_url=sim.root_url) as http:
        # The stream is open before the turn starts, and the turn thinks long enough to be cut in
        # the middle whatever the machine's load (it is dropped as soon as its first event is seen).
        for _ in range(1500):
            if (await http.get("/_sim/stats")).json()["open_streams"] >= 1:
                break
            await asyncio.sleep(0.02)
        await ark.send(sid, [user_message("slow [sim:think=3] [sim:progress]"), system_message()])
        await asyncio.wait_for(first_event.wait(), 30)
        dropped = (await http.post("/_sim/drop_streams", json={"session_id": sid})).json()["dropped"]
    assert dropped == 1
    await asyncio.wait_for(task, 10)
    assert subscription.reconnects >= 1
    _assert_exactly_history(seen, [e async for e in ark.list(sid)])


async def test_send_timeout_is_looked_up_not_resent(sim: SimServer) -> None:
    """The server accepts but answers late: the client times out, finds its id in history, does not re-send."""
    await _set_faults(sim, accept_delay=1.0)
    sid = await sim.create_session()
    async with make_client(sim, "ark", timeout=0.3) as client:
        echoed = await client.send(sid, [user_message("once", "stable-1"), system_message()])
        await _set_faults(sim, accept_delay=0.0)
        assert [e.type for e in echoed] == ["user.message", "system.message"]
        assert echoed[0].id == "stable-1"
        history = [e async for e in client.list(sid)]
    assert [e.id for e in history if e.type == "user.message"] == ["stable-1"]
    stats = sim.sim.context.stats
    assert stats["accepted:user.message"] == 1 and stats["post_events"] == 1


async def test_resume_from_cursor_in_another_subscription(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    for n in range(3):
        await ark.send(sid, [user_message(f"m{n}"), system_message()])
    for _ in range(200):
        if sum(1 for e in sim.sessions[sid].log if e["type"] == "session.status_idle") == 3:
            break
        await asyncio.sleep(0.01)
    first_part: list[ServerEvent] = []
    subscription = ark.subscribe(sid)
    async for item in subscription:
        assert not isinstance(item, Preview)
        first_part.append(item)
        if len(first_part) == 9:
            break
    cursor = subscription.cursor
    assert cursor == first_part[-1].id
    rest: list[ServerEvent] = []
    async with make_client(sim, "ark") as other_process:
        async for item in other_process.subscribe(sid, after=cursor):
            assert not isinstance(item, Preview)
            rest.append(item)
            if sum(1 for e in first_part + rest if e.type == "session.status_idle") == 3:
                break
    _assert_exactly_history(first_part + rest, [e async for e in ark.list(sid)])


async def test_many_concurrent_subscriptions_with_drops_and_latency(sim: SimServer) -> None:
    await _set_faults(sim, drop_stream_prob=0.05, latency_ms=2, seed=5)
    session_ids = [await sim.create_session() for _ in range(25)]
    async with make_client(sim, "ark") as client:
        results = await asyncio.wait_for(asyncio.gather(*(_drive_turns(client, sid, 4) for sid in session_ids)), 30)
        await _set_faults(sim, drop_stream_prob=0.0, latency_ms=0)
        for sid, (seen, _) in zip(session_ids, results, strict=True):
            _assert_exactly_history(seen, [e async for e in client.list(sid)])
    assert sum(reconnects for _, reconnects in results) > 0
