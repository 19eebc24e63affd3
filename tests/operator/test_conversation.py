"""`switchboard conversation`'s reading and report, on a real Redis (one server and a cluster):
a session found back to its conversation, the stored state described without message texts, the
delivered markers of the last outbound messages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiokafka.partitioner import murmur2

from pipeline.operator import conversation as conv
from pipeline.platforms import get_platform
from pipeline.records import OutboundMessage, conversation_key
from pipeline.segments import segment_list_adapter
from pipeline.state import InflightStream, State, TurnRecord, close_redis_py, redis_py_client

CONVERSATION = conversation_key("telegram", "tg1", "chat:{1}%")  # every character a key encodes


@pytest.fixture(params=["redis", "cluster"])
def state_url(request: pytest.FixtureRequest) -> str:
    if request.param == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
async def state(state_url: str, redis_prefix: str) -> AsyncIterator[State]:
    state = State.connect(state_url, redis_prefix, mapping_ttl=600, dedup_ttl=300)
    yield state
    await state.redis.aclose()


def outbound(outbound_id: str, text: str = "the reply text", **hops: float) -> OutboundMessage:
    return OutboundMessage(
        outbound_id=outbound_id,
        kind="reply",
        platform="telegram",
        bot_id="tg1",
        chat_id="chat:{1}%",
        chat_type="private",
        conversation_key=CONVERSATION,
        segments=segment_list_adapter.validate_python([{"type": "text", "data": {"text": text}}]),
        hops=hops,
    )


def test_session_partition_is_the_producers() -> None:
    for key in (CONVERSATION, "qqbot:qb1:group:G1", "x"):
        assert conv.session_partition(key, 8) == (murmur2(key.encode()) & 0x7FFFFFFF) % 8


async def test_a_session_is_found_back_to_its_conversation(state: State, state_url: str) -> None:
    other = conversation_key("slack", "sl1", "C1")
    await state.conversations.map_session(CONVERSATION, "sesn-mapped")
    await state.conversations.map_session(other, "sesn-other")
    await state.streams.add_inflight(3, InflightStream("sesn-streaming", other))
    redis = redis_py_client(state_url)
    try:
        assert await conv.conversation_of_session(state, redis, 8, "sesn-mapped") == CONVERSATION  # by SCAN
        assert await conv.conversation_of_session(state, redis, 8, "sesn-streaming") == other  # in flight
        assert await conv.conversation_of_session(state, redis, 8, "sesn-nobody") is None
    finally:
        await close_redis_py(redis)


async def test_the_report_shows_the_state_and_no_text_unless_asked(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session(CONVERSATION, "sesn-1")
    await conversations.update_conversation(
        CONVERSATION, status="running", cursor="sesn-1|sevt-9", held=1, last_message="what the agent said"
    )
    turn = TurnRecord(
        trace_id="tr-1",
        platform="telegram",
        bot_id="tg1",
        chat_id="chat:{1}%",
        chat_type="private",
        hops={"dispatch": 1_800_000_000_000.0},
        inbound_ids=["m-1"],
    )
    keys = state.keys
    await state.redis.execute("SET", keys.turn("turn-1", CONVERSATION), turn.model_dump_json())
    await state.redis.execute("RPUSH", keys.turns(CONVERSATION), "turn-1")
    held = json.dumps({"kind": "user_turn", "inbound_ids": ["m-2"], "events": [{"text": "the held text"}]})
    await state.redis.execute("RPUSH", keys.held(CONVERSATION), f"turn-2\n{held}")
    partition = conv.session_partition(CONVERSATION, 8)
    await state.streams.add_inflight(partition, InflightStream("sesn-1", CONVERSATION))

    stored = await conv.read_state(state, CONVERSATION, 8)
    first, replayed = outbound("out-1"), outbound("out-2", replay=1_800_000_100_000.0)
    await state.deliveries.mark_delivered("telegram:tg1", ["out-1"])
    flags = await conv.delivered_flags(state, get_platform("telegram"), [first, replayed])
    assert flags == [True, False]
    assert await conv.delivered_flags(state, get_platform("console"), [first]) == [None]  # no markers kept
    seen = [
        conv.OutboundSeen(0, 5, 1_800_000_050_000, first, True),
        conv.OutboundSeen(0, 6, 1_800_000_100_000, replayed, False),
    ]
    report = conv.describe(CONVERSATION, stored, seen)
    assert report["session"] == "sesn-1" and report["status"] == "running" and report["partition"] == partition
    assert report["chat"] == "chat:{1}%" and report["user"] is None
    [in_flight] = report["turns_in_flight"]
    assert in_flight["turn_id"] == "turn-1" and in_flight["inbound_ids"] == ["m-1"]
    assert in_flight["started"] == "2027-01-15T08:00:00Z"
    assert report["stream"] == {"held_by_a_worker": True, "cursor": "sevt-9"}
    assert report["held"] == [{"turn_id": "turn-2", "kind": "user_turn", "inbound_ids": ["m-2"], "trace_id": None}]
    assert report["last_delivered"]["outbound_id"] == "out-1"
    assert report["last_replies"][1]["replayed"] == "2027-01-15T08:01:40Z"
    text = json.dumps(report) + "\n".join(conv.render_text(report))
    for body in ("the reply text", "the held text", "what the agent said"):
        assert body not in text
    lines = conv.render_text(report)
    assert "  session     sesn-1" in lines and "  stream      held by a worker, cursor sevt-9" in lines
    assert any(line.strip().startswith("turn-1: started 2027-01-15T08:00:00Z") for line in lines), lines
    assert report["known"]
    nobody = conversation_key("telegram", "tg1", "never-seen")
    unknown = conv.describe(nobody, await conv.read_state(state, nobody, 8), [])
    assert not unknown["known"] and "nothing kept" in conv.render_text(unknown)[0]
    with_bodies = json.dumps(conv.describe(CONVERSATION, stored, seen, bodies=True))
    for body in ("the reply text", "the held text", "what the agent said"):
        assert body in with_bodies
