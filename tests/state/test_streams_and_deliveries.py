"""Streams in flight, delivered markers and the shared rate windows, against a real redis-server."""

from __future__ import annotations

import asyncio

from pipeline.state import InflightStream, RateWindow, State


async def test_inflight_streams_per_partition_resume_from_the_saved_cursor(state: State) -> None:
    streams = state.streams
    await streams.add_inflight(3, InflightStream("s1", "k1", trace_id="t1"))
    await streams.add_inflight(3, InflightStream("s2", "k2"))
    await streams.add_inflight(4, InflightStream("s3", "k3"))
    await state.conversations.update_conversation("k2", session_id="s2", cursor="s2|sevt-9")
    got = {s.session_id: s for s in await streams.inflight(3)}
    assert set(got) == {"s1", "s2"}
    assert got["s2"].cursor == "sevt-9" and got["s1"].cursor is None
    assert got["s1"].conversation_key == "k1" and got["s1"].trace_id == "t1"
    await streams.remove_inflight(3, "s1", "k1")
    assert [s.session_id for s in await streams.inflight(3)] == ["s2"]


async def test_a_cursor_of_an_older_session_is_not_resumed(state: State) -> None:
    await state.streams.add_inflight(0, InflightStream("new", "k"))
    await state.conversations.update_conversation("k", session_id="new", cursor="old|sevt-1")
    (stream,) = await state.streams.inflight(0)
    assert stream.cursor is None


async def test_claim_reports_what_was_delivered_and_takes_no_slot_for_it(state: State) -> None:
    deliveries = state.deliveries
    window = RateWindow("chat", limit=1, seconds=60)
    first = await deliveries.claim("b", ["out-1", "out-1:0", "out-1:1"], [window])
    assert first.delivered == [None, None, None] and first.wait == 0
    await deliveries.mark_delivered("b", ["out-1:0"])
    partly = await deliveries.claim("b", ["out-1", "out-1:0", "out-1:1"], [])
    assert partly.delivered == [None, "1", None]
    await deliveries.mark_delivered("b", ["out-1:1", "out-1"])
    done = await deliveries.claim("b", ["out-1", "out-1:0", "out-1:1"], [window])
    assert done.delivered[0] == "1" and done.wait == 0  # delivered before: no slot needed


async def test_rate_windows_are_all_or_nothing_and_say_how_long_to_wait(state: State) -> None:
    deliveries = state.deliveries
    chat = RateWindow("console:b:c1", limit=2, seconds=1)
    bot = RateWindow("console:b", limit=3, seconds=10)
    assert (await deliveries.claim("b", [], [chat, bot])).wait == 0
    assert (await deliveries.claim("b", [], [chat, bot])).wait == 0
    blocked = await deliveries.claim("b", [], [chat, bot])  # the chat's window is full
    assert 0 < blocked.wait <= 1.0
    other_chat = RateWindow("console:b:c2", limit=2, seconds=1)
    assert (await deliveries.claim("b", [], [other_chat, bot])).wait == 0  # the bot's 3rd slot
    assert (await deliveries.claim("b", [], [other_chat, bot])).wait > 1.0  # now the bot's window is full
    await asyncio.sleep(1.05)
    # c1's window has room again, but the bot's does not: nothing is taken
    assert (await deliveries.claim("b", [], [chat, bot])).wait > 0
    assert await deliveries.redis.execute("ZCARD", state.keys.rate_window("console:b:c1", "b")) == 0
