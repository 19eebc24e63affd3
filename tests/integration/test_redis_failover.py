"""The Redis primary SIGKILLed in the middle of the traffic, behind Redis Sentinel: the replica is
promoted, the worker follows it without a restart, and every accepted message is answered once.

The stack runs on a `redis+sentinel://` URL (`pipeline.embedded.SentinelTopology`: a primary, a replica and
three sentinels, real processes); the primary is killed while messages are being sent and turns are
running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pipeline.embedded import SentinelTopology, run_sync
from pipeline.stack import Stack

from .console import ConsoleClient
from .stacks import running_stack

pytestmark = [pytest.mark.integration]

PASSWORD = "failover-Test-Passw0rd"


@pytest.fixture(scope="module")
def topology() -> Iterator[SentinelTopology]:
    topology = run_sync(SentinelTopology(password=PASSWORD).start())
    try:
        yield topology
    finally:
        run_sync(topology.stop())


@pytest.fixture(scope="module")
def sentinel_stack(topology: SentinelTopology) -> Iterator[Stack]:
    # As a Sentinel deployment should run: a write that protects a reply waits for a replica, so the
    # primary's SIGKILL cannot take a turn's start with it after its message reached the session.
    replica_wait = {"SWITCHBOARD_REDIS_REPLICA_WAIT_MS": "100"}
    with running_stack(
        "tansu", name="failover", redis_url=topology.url(), partitions=2, env_extra=replica_wait
    ) as stack:
        yield stack


async def test_primary_killed_mid_traffic_every_message_answered_once(
    sentinel_stack: Stack, topology: SentinelTopology
) -> None:
    stack = sentinel_stack
    console = ConsoleClient(stack)
    chats = [console.chat("failover") for _ in range(6)]
    for chat in chats:  # sessions exist before the fault
        await console.send(chat, "hello")
    for chat in chats:
        await console.wait_for(chat, 1, timeout=60)

    # Turns in flight (the agent thinks for a second) and messages still arriving when it dies.
    for chat in chats[:3]:
        await console.send(chat, "[sim:think=1] during")
    await topology.primary.kill()  # SIGKILL
    killed = time.monotonic()
    for chat in chats[3:]:
        await console.send(chat, "after")  # ingress needs only the broker: accepted

    # The console's own reads go through Redis too: read once the sentinels have promoted.
    assert await topology.wait_promoted(topology.primary) is topology.replica
    expected = {chat: ["echo: hello", "echo: during" if chat in chats[:3] else "echo: after"] for chat in chats}
    got, answered = await console.all_answered(chats, 2, since=killed)
    print(f"\nprimary SIGKILLed: every message answered {answered:.1f} s after the kill")
    assert got == expected
    assert await topology.primary_address() == (topology.replica.host, topology.replica.port)
    assert all(worker.is_running for worker in stack.workers)  # followed, not restarted
    for worker in stack.workers:
        assert PASSWORD not in worker.log_path.read_text(errors="replace")
