"""The pipeline on a Redis Cluster (`redis+cluster://`, 3 primaries + 3 replicas, real processes):
a turn end to end, a redelivered webhook answered once, the console's live notes (plain pub/sub
across the cluster), then a primary SIGKILLed mid-traffic, its replica promoted by the cluster, the
workers following it without a restart, every accepted message answered exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from pipeline.embedded import RedisCluster
from pipeline.stack import Stack

from .console import ConsoleClient, texts
from .stacks import running_stack

pytestmark = [pytest.mark.integration]

PASSWORD = "c1uster-Stack-Passw0rd"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(password=PASSWORD, node_timeout_ms=1000) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster_stack(cluster: RedisCluster) -> Iterator[Stack]:
    with running_stack("tansu", name="rcluster", redis_url=cluster.url, partitions=2) as stack:
        yield stack


async def test_a_turn_end_to_end_a_duplicate_once_and_live_notes(cluster_stack: Stack) -> None:
    console = ConsoleClient(cluster_stack)
    chat = console.chat("cl")
    await console.send(chat, "hello")
    assert texts(await console.wait_for(chat, 1, timeout=60)) == ["echo: hello"]
    again = console.chat("cl")
    for _ in range(3):
        await console.send(again, "only once", message_id="platform-msg-1")
    await console.wait_for(again, 1, timeout=60)
    assert texts(await console.settle(again)) == ["echo: only once"]
    busy = console.chat("cl")
    async with console.stream(busy) as live:
        await console.send(busy, "[sim:think=2] first")
        await asyncio.sleep(0.8)  # the first turn is running now
        held = [(await console.send(busy, word))["message_id"] for word in ("alpha", "beta")]
        await live.next()  # echo: first
        _, merged = await live.next()  # the merged turn's reply
        assert "alpha" in texts([merged])[0] and "beta" in texts([merged])[0]
        *held_notes, merged_note = live.notes
        # Held one by one, or both at once when ingest took them in one batch and merged them.
        assert {note["note"] for note in held_notes} == {"held"}
        assert [i for note in held_notes for i in note["message_ids"]] == held
        assert merged_note == {"note": "merged", "message_ids": held}


async def test_primary_killed_mid_traffic_every_message_answered_once(
    cluster_stack: Stack, cluster: RedisCluster
) -> None:
    stack = cluster_stack
    console = ConsoleClient(stack)
    chats = [console.chat("clfail") for _ in range(9)]  # spread over the three primaries' slots
    for chat in chats:  # sessions exist before the fault
        await console.send(chat, "hello")
    for chat in chats:
        await console.wait_for(chat, 1, timeout=60)

    victim = (await cluster.primaries())[0]
    for chat in chats[:4]:  # turns in flight when it dies
        await console.send(chat, "[sim:think=1] during")
    followers = await cluster.kill(victim)  # SIGKILL
    killed = time.monotonic()
    for chat in chats[4:]:
        await console.send(chat, "after")  # ingress needs only the broker: accepted

    promoted = await cluster.wait_promoted(victim)
    expected = {chat: ["echo: hello", "echo: during" if chat in chats[:4] else "echo: after"] for chat in chats}
    got, answered = await console.all_answered(chats, 2, since=killed)
    print(f"\ncluster primary SIGKILLed: every message answered {answered:.1f} s after the kill")
    assert got == expected
    assert promoted in followers
    assert all(worker.is_running for worker in stack.workers)  # followed, not restarted
    for worker in stack.workers:
        assert PASSWORD not in worker.log_path.read_text(errors="replace")
