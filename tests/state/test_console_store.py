"""The console's store on a real Redis: once per outbound id, a sequence number per chat, one live
channel, the list capped."""

from __future__ import annotations

import asyncio
import json

from pipeline.state import ConsoleStore, Keys, LiveMessage, RedisClient, message_seq, redis_py_client
from pipeline.state import pubsub as redis_pubsub
from pipeline.state.console import CHAT_CAP


def store(url: str, prefix: str) -> ConsoleStore:
    """The console's store on one server or the cluster (`state_url`: tests/state/conftest.py)."""
    client = RedisClient(url)
    return ConsoleStore(client, Keys(prefix, cluster=client.cluster), mapping_ttl=3600, dedup_ttl=600)


async def test_append_is_once_per_message_id_and_numbered_per_chat(state_url: str, redis_prefix: str) -> None:
    console = store(state_url, redis_prefix)
    assert await console.append("demo", "c1", {"id": "out-1"}, message_id="out-1") == 1
    assert await console.append("demo", "c1", {"id": "out-1"}, message_id="out-1") == 0  # a replay
    assert await console.append("demo", "c1", {"id": "out-2", "text": "héllo\nworld"}, message_id="out-2") == 2
    assert await console.append("demo", "c1", {"n": 3}) == 3  # no id: always appended
    assert await console.append("demo", "c2", {"id": "out-9"}, message_id="out-9") == 1  # its own numbering
    stored = await console.messages("demo", "c1")
    assert [json.loads(m) for m in stored] == [
        {"seq": 1, "id": "out-1"},
        {"seq": 2, "id": "out-2", "text": "héllo\nworld"},
        {"seq": 3, "n": 3},
    ]
    assert [message_seq(m) for m in stored] == [1, 2, 3]
    ttl = await console.redis.execute("TTL", console.keys.scoped("console-posted", "demo:c1", "out-1"))
    assert 0 < ttl <= 600
    assert 0 < await console.redis.execute("TTL", console.keys.scoped("console", "demo:c1")) <= 3600


async def test_each_append_is_published_once_with_its_chat_and_seq(state_url: str, redis_prefix: str) -> None:
    console = store(state_url, redis_prefix)
    subscriber = redis_py_client(state_url, decode_responses=True)
    pubsub = await redis_pubsub(subscriber)
    await pubsub.subscribe(console.channel)
    try:
        chat = 'odd "chat"\nid'
        await console.append("demo", chat, {"id": "a"}, message_id="a")
        await console.append("demo", chat, {"id": "a"}, message_id="a")  # not published again
        await console.append("other", "c", {"id": "b"}, message_id="b")
        received: list[LiveMessage] = []
        async with asyncio.timeout(5):
            while len(received) < 2:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    received.append(LiveMessage.parse(message["data"]))
        assert received == [
            LiveMessage("demo", chat, 1, '{"seq":1,"id": "a"}'),
            LiveMessage("other", "c", 1, '{"seq":1,"id": "b"}'),
        ]
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3) is None
    finally:
        await pubsub.aclose()
        await subscriber.aclose()


async def test_the_chat_keeps_its_newest_messages(state_url: str, redis_prefix: str) -> None:
    console = store(state_url, redis_prefix)
    for i in range(CHAT_CAP + 5):
        await console.append("demo", "c", {"i": i})
    stored = await console.messages("demo", "c")
    assert len(stored) == CHAT_CAP
    assert message_seq(stored[0]) == 6 and message_seq(stored[-1]) == CHAT_CAP + 5


def test_live_messages_that_are_not_ours_are_refused() -> None:
    for bad in ("", "no newline", '["demo"]\n{}', '["demo","c","1"]\n{}', "{}\n{}", "[1,2,3]\n{}"):
        try:
            LiveMessage.parse(bad)
        except (ValueError, TypeError):
            continue
        raise AssertionError(f"accepted {bad!r}")
