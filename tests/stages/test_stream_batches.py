"""The session stream holds an agent.message until the event after it, and produces the two with
no wait in between (one producer batch), so render reads them together. Against a real Redis (the
stream store); the session's events come from a scripted subscription, the records go to a
recorder at the producer seam."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from pipeline.records import SessionEventRecord
from pipeline.session.exceptions import TransportError
from pipeline.session.models import (
    AgentMessage,
    AgentToolUse,
    EndTurn,
    ServerEvent,
    SessionError,
    SessionStatusIdle,
    SessionStatusRunning,
    SessionUsage,
    TextBlock,
    UsageSnapshot,
)
from pipeline.stages.outputs import Outputs
from pipeline.stages.streams import StreamRegistry
from pipeline.state import InflightStream, State

SESSION = "s1"


class _Scripted:
    """A subscription whose events the test releases one by one (an exception ends it so)."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[ServerEvent | Exception] = asyncio.Queue()
        self.reconnects = 0

    async def _run(self) -> AsyncIterator[ServerEvent]:
        while True:
            item = await self.events.get()
            if isinstance(item, Exception):
                raise item
            yield item

    def __aiter__(self) -> AsyncIterator[ServerEvent]:
        return self._run()


class _Client:
    def __init__(self, subscription: _Scripted) -> None:
        self.subscription = subscription

    def subscribe(self, session_id: str, **_: Any) -> _Scripted:
        assert session_id == SESSION
        return self.subscription


class _Ticks:
    """Counts the event loop's turns: two sends with the same count had no wait between them."""

    def __init__(self) -> None:
        self.count = 0
        self.sent: list[tuple[int, str]] = []
        self.records: list[SessionEventRecord] = []

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1

    async def send(self, topic: str, key: str | None, value: bytes) -> None:
        record = SessionEventRecord.model_validate_json(value)
        self.records.append(record)
        self.sent.append((self.count, record.event.type))


async def _stream(
    redis_url: str, redis_prefix: str, *, accounts_usage: bool = True
) -> tuple[StreamRegistry, _Scripted, _Ticks, State]:
    state = State.connect(redis_url, redis_prefix)
    subscription, ticks = _Scripted(), _Ticks()
    registry = StreamRegistry(
        state.streams,
        cast(Any, _Client(subscription)),
        Outputs(ticks.send),
        accounts_usage=lambda conversation: accounts_usage and conversation == "console:demo:c1",
    )
    await registry.track(0, InflightStream(SESSION, "console:demo:c1", trace_id="t1"))
    return registry, subscription, ticks, state


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _message(event_id: str, text: str) -> AgentMessage:
    return AgentMessage(id=event_id, content=[TextBlock(text=text)])


async def test_a_message_goes_out_with_the_turn_end_after_it(redis_url: str, redis_prefix: str) -> None:
    registry, subscription, ticks, state = await _stream(redis_url, redis_prefix)
    ticker = asyncio.create_task(ticks.run())
    try:
        subscription.events.put_nowait(SessionStatusRunning(id="e1"))
        subscription.events.put_nowait(_message("e2", "first"))
        subscription.events.put_nowait(_message("e3", "the reply"))
        await _settle()
        assert ticks.sent == []  # nothing render could act on yet
        subscription.events.put_nowait(SessionStatusIdle(id="e4", stop_reason=EndTurn()))
        await _settle()
        assert [kind for _, kind in ticks.sent] == ["agent.message", "agent.message", "session.status_idle"]
        assert len({tick for tick, _ in ticks.sent}) == 1, ticks.sent  # no wait between them: one batch
    finally:
        ticker.cancel()
        await registry.close()
        await state.redis.aclose()


async def test_a_turns_usage_goes_to_render_only_for_a_bot_that_keeps_budgets(
    redis_url: str, redis_prefix: str
) -> None:
    """The usage report comes between the reply and the idle (P9): with budgets it goes out in the
    same batch; without, render would read it for nothing, so it is not produced at all."""
    for budgeted, expected in (
        (True, ["agent.message", "session.usage", "session.status_idle"]),
        (False, ["agent.message", "session.status_idle"]),
    ):
        registry, subscription, ticks, state = await _stream(redis_url, redis_prefix, accounts_usage=budgeted)
        ticker = asyncio.create_task(ticks.run())
        try:
            subscription.events.put_nowait(_message("e1", "the reply"))
            subscription.events.put_nowait(SessionUsage(id="sevt-usg-e2", usage=UsageSnapshot(input_tokens=9)))
            subscription.events.put_nowait(SessionStatusIdle(id="e2", stop_reason=EndTurn()))
            await _settle()
            assert [kind for _, kind in ticks.sent] == expected, budgeted
            assert len({tick for tick, _ in ticks.sent}) == 1, ticks.sent
        finally:
            ticker.cancel()
            await registry.close()
            await state.redis.aclose()


async def test_a_message_before_a_tool_call_goes_out_with_the_call(redis_url: str, redis_prefix: str) -> None:
    registry, subscription, ticks, state = await _stream(redis_url, redis_prefix)
    ticker = asyncio.create_task(ticks.run())
    try:
        subscription.events.put_nowait(_message("e1", "looking it up"))
        await _settle()
        assert ticks.sent == []
        subscription.events.put_nowait(AgentToolUse(id="e2", name="web_search"))
        await _settle()
        assert [kind for _, kind in ticks.sent] == ["agent.message", "agent.tool_use"]
        assert ticks.sent[0][0] == ticks.sent[1][0]
        subscription.events.put_nowait(SessionStatusIdle(id="e3", stop_reason=EndTurn()))
        await _settle()
        assert [kind for _, kind in ticks.sent[2:]] == ["session.status_idle"]
    finally:
        ticker.cancel()
        await registry.close()
        await state.redis.aclose()


async def test_a_stream_that_fails_after_a_message_still_delivers_it_before_the_failure(
    redis_url: str, redis_prefix: str
) -> None:
    registry, subscription, ticks, state = await _stream(redis_url, redis_prefix)
    try:
        subscription.events.put_nowait(_message("e1", "partial"))
        subscription.events.put_nowait(TransportError("gave up"))
        await _settle()
        assert [kind for _, kind in ticks.sent] == ["agent.message", "session.error", "session.status_idle"]
        error = ticks.records[1].event
        assert isinstance(error, SessionError) and error.error.type == "stream_failed"
    finally:
        await registry.close()
        await state.redis.aclose()


async def test_a_resumed_turn_tracked_again_ends_with_its_one_idle(redis_url: str, redis_prefix: str) -> None:
    """A crash cut a send short after the turn was recorded in flight: the new owner resumes the
    stream from that entry, then sends the turn and tracks the same turn again. Its one idle ends
    it; a second turn (another trace, busy policy `interrupt`) still needs an idle of its own."""
    registry, subscription, ticks, state = await _stream(redis_url, redis_prefix)
    try:
        await registry.track(0, InflightStream(SESSION, "console:demo:c1", trace_id="t1"))  # the same turn
        assert registry.turns_in_flight == 1
        subscription.events.put_nowait(_message("e1", "the reply"))
        subscription.events.put_nowait(SessionStatusIdle(id="e2", stop_reason=EndTurn()))
        await _settle()
        assert [record.event.type for record in ticks.records] == ["agent.message", "session.status_idle"]
        assert registry.turns_in_flight == 0  # lingering between turns, not waiting for a second idle

        await registry.track(0, InflightStream(SESSION, "console:demo:c1", trace_id="t2"))
        await registry.track(0, InflightStream(SESSION, "console:demo:c1", trace_id="t3"))  # while t2 runs
        subscription.events.put_nowait(SessionStatusIdle(id="e3", stop_reason=EndTurn()))
        await _settle()
        assert registry.turns_in_flight == 1  # t3's idle still to come
        subscription.events.put_nowait(SessionStatusIdle(id="e4", stop_reason=EndTurn()))
        await _settle()
        assert registry.turns_in_flight == 0
    finally:
        await registry.close()
        await state.redis.aclose()
