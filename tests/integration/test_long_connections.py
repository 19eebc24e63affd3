"""OneBot v11 over WebSocket with several workers on a real broker and Redis: each bot's connection
held exactly once, taken over when its holder is SIGKILLed mid-traffic, every message the stand-in
delivered answered exactly once, and replies sent over the held connection when the outbound record
landed on a worker that does not hold it.

One stack for the module (workers are real processes, started with the tests' lease of 3 s and
acquisition interval of 0.5 s), two OneBot bots: `fwd` (`ws-forward`: the workers dial the stand-in's
WebSocket server) and `rev` (`ws-reverse`: the stand-in dials the workers, round robin over those
that answer, as a load balancer would). The stand-in checks every action with the OneBot HTTP API
stand-in's checker. The simulator's agent echoes: a message `m<n>` is answered `echo: m<n>`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from pipeline.embedded import RedisServer
from pipeline.records import OutboundMessage
from pipeline.stack import Stack, WorkerProcess
from pipeline.topics import cluster_specs, outbound_topic
from pipeline.worker.driver import KeyPartitioner
from tests.conftest import enabled_brokers
from tests.platforms.test_onebot import SPEC_PRIVATE, TOKEN

from .onebot_peers import PeerThread
from .stacks import add_workers, running_stack, stack_idle

#: After a holder's takeover the stand-ins send again what was not acknowledged; the outcome is
#: final once the stack stays idle a little longer than after plain traffic.
TAKEOVER_QUIET_SECONDS = 1.0

pytestmark = [pytest.mark.integration]

SELF_ID = 10001000
PARTITIONS = 4


def _check_action(action: str, params: Any) -> None:
    from tests.connections.test_onebot_ws import check_action

    check_action(action, params)


def _bots_toml(forward_url: str) -> str:
    common = f'self_id = "{SELF_ID}"\nlanguage = "en"\ncredentials = {{ access_token = "{TOKEN}" }}\n'
    forward = f'[[bots]]\nplatform = "onebot"\nbot_id = "fwd"\ntransport = "ws-forward"\napi_base = "{forward_url}"\n'
    reverse = '[[bots]]\nplatform = "onebot"\nbot_id = "rev"\ntransport = "ws-reverse"\n'
    return f"{forward}{common}\n{reverse}{common}"


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def napcat_server(broker_kind: str) -> Iterator[PeerThread]:
    """The forward stand-in: a WebSocket server the workers dial."""
    peer = PeerThread(self_id=SELF_ID, access_token=TOKEN, heartbeat_interval=2.0, check_action=_check_action).start()
    peer.serve()
    try:
        yield peer
    finally:
        peer.stop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, napcat_server: PeerThread) -> Iterator[Stack]:
    assert napcat_server.peer is not None
    toml = _bots_toml(napcat_server.peer.url)
    with running_stack(
        broker_kind, name="conn", bots_toml=toml, redis_url=redis_server.url, partitions=PARTITIONS
    ) as s:
        asyncio.run(add_workers(s))
        yield s


@pytest.fixture(scope="module")
def napcat_client(stack: Stack) -> Iterator[PeerThread]:
    """The reverse stand-in: dials the running workers in turn (a load balancer)."""
    peer = PeerThread(
        self_id=SELF_ID, access_token=TOKEN, heartbeat_interval=2.0, reconnect_interval=0.5, check_action=_check_action
    ).start()
    peer.dial(lambda: [f"ws://127.0.0.1:{w.port}/onebot/ws/rev" for w in stack.workers if w.is_running])
    try:
        yield peer
    finally:
        peer.stop()


@pytest.fixture(autouse=True)
def _stand_ins_saw_only_valid_requests(napcat_server: PeerThread) -> Iterator[None]:
    yield
    assert napcat_server.errors == [], "actions the real implementation would refuse"


# -- helpers ---------------------------------------------------------------------------------------


def event(n: int, text: str) -> dict[str, Any]:
    """A private message from user 60000+n (the spec's report), one chat per message."""
    return dict(
        SPEC_PRIVATE,
        time=int(time.time()),
        user_id=60_000 + n,
        message_id=5_000 + n,
        message=[{"type": "text", "data": {"text": text}}],
        raw_message=text,
    )


def answered(peer: PeerThread) -> Counter[int]:
    """Accepted replies per message number (from `echo: m<n>` to user 60000+n)."""
    counts: Counter[int] = Counter()
    for action in peer.replies():
        text = "".join(s["data"].get("text", "") for s in action.params["message"] if s["type"] == "text")
        n = action.params["user_id"] - 60_000
        assert text == f"echo: m{n}", (text, n)
        counts[n] += 1
    return counts


def delivered_numbers(peer: PeerThread) -> set[int]:
    return {e["user_id"] - 60_000 for e, _, _ in peer.delivered()}


async def each_answered_once(stack: Stack, peer: PeerThread, sent: range) -> None:
    """Every message sent reached a socket, and each is answered exactly once (none twice, even
    once the stack has nothing left in flight that could repeat one)."""
    await answered_exactly_once(stack, sent, delivered=lambda: delivered_numbers(peer), answered=lambda: answered(peer))


#: Egress writes a reply's delivered marker right after the platform's answer: a reply the platform
#: accepted this long before a SIGKILL has its marker, whatever the load.
SETTLED_SECONDS = 1.0


@dataclass(frozen=True)
class Kill:
    """What the platform's stand-in had answered `SETTLED_SECONDS` before a holder's SIGKILL
    (`settled`) and once the worker was dead (`at_kill`)."""

    settled: Counter[int]
    at_kill: Counter[int]


async def kill_noting_answers(worker: WorkerProcess, answered: Callable[[], Counter[int]]) -> Kill:
    """SIGKILL `worker`, noting the answers a moment before and right after."""
    settled = answered()
    await asyncio.sleep(SETTLED_SECONDS)
    await worker.kill()
    return Kill(settled, answered())


@dataclass(frozen=True)
class SendGap:
    """A platform with no idempotency key for sending (docs/platforms.md, "Sent once, or at least
    once"): a worker SIGKILLed after the platform accepted a reply and before egress marked it
    delivered leaves the reply unmarked, and the replay of its record sends it again. That, and
    nothing else, may show as a message answered twice."""

    platform: str
    kill: Kill

    async def explains(self, stack: Stack, repeated: dict[int, int]) -> list[int]:
        """The repeats that are this gap: the same reply (one outbound id in its conversation) sent
        twice, the first time in the moment before the kill. Fails if a conversation got two
        different replies (a second turn, not a resend)."""
        replies = await reply_ids(stack, self.platform)
        two = {key: ids for key, ids in replies.items() if len(ids) > 1}
        assert two == {}, f"conversations answered by more than one reply: {two}"
        settled, at_kill = self.kill.settled, self.kill.at_kill
        return sorted(n for n, count in repeated.items() if count == 2 and settled[n] == 0 and at_kill[n] == 1)


async def reply_ids(stack: Stack, platform: str) -> dict[str, set[str]]:
    """The outbound ids of every reply in `im.outbound.<platform>`, by conversation."""
    settings = stack.settings()
    topic = outbound_topic(platform)
    spec = next(s for s in cluster_specs(settings) if s.name == topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(spec.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        replies: dict[str, set[str]] = {}

        async def unread() -> bool:
            return any([await consumer.position(tp) < end for tp, end in ends.items()])

        while await unread():
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for record in records:
                    message = OutboundMessage.model_validate_json(record.value or b"")
                    if message.kind == "reply":
                        replies.setdefault(message.conversation_key, set()).add(message.outbound_id)
        return replies
    finally:
        await consumer.stop()


async def answered_exactly_once(
    stack: Stack,
    sent: range,
    *,
    delivered: Callable[[], set[int]],
    answered: Callable[[], Counter[int]],
    gap: SendGap | None = None,
) -> list[int]:
    """Every message sent was delivered to Switchboard, and each is answered exactly once, even
    after the stack is idle (nothing unread, pending or running: a repeat would have come by then).
    With `gap`, a repeat that gap explains is allowed: returns those messages."""
    reached = delivered() & set(sent)
    assert reached == set(sent), f"not delivered: {set(sent) - reached}"
    await wait_for(lambda: reached <= set(answered()), f"every message answered ({len(reached)})", 120)
    await stack_idle(stack, quiet=TAKEOVER_QUIET_SECONDS)
    counts = answered()
    repeated = {n: counts[n] for n in reached if counts[n] != 1}
    resent = await gap.explains(stack, repeated) if gap is not None and repeated else []
    assert {n: c for n, c in repeated.items() if n not in resent} == {}, (repeated, f"resent in the gap: {resent}")
    return resent


async def lease_holder(
    stack: Stack, bot_id: str, *, platform: str = "onebot", channel: str = "api"
) -> tuple[WorkerProcess | None, int]:
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        value = cast(str | None, await client.get(f"{settings.redis_prefix}lease:{platform}:{bot_id}:{channel}"))
    finally:
        await client.aclose()
    if not value:
        return None, 0
    holder, token, _state = value.split("|")
    return next((w for w in stack.workers if w.instance_id == holder and w.is_running), None), int(token)


async def metric(worker: WorkerProcess, name: str, **labels: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{worker.url}/metrics")).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


class Traffic:
    """Messages `m<first>`, `m<first+1>`, … every `every` seconds, each from its own user, while the
    agent thinks `think` seconds on each (so turns are in flight whenever a worker dies)."""

    def __init__(self, peer: PeerThread, first: int, *, every: float = 0.15, think: float = 1.5) -> None:
        self.peer, self.next, self.every, self.think = peer, first, every, think
        self.first = first
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop:
            await self.flowing.wait()
            await self.peer.send_event(event(self.next, f"m{self.next} [sim:think={self.think}]"))
            self.next += 1
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> range:
        self._stop = True
        self.flowing.set()
        assert self._task is not None
        await self._task
        return range(self.first, self.next)


async def sigkill_holder_mid_traffic(stack: Stack, peer: PeerThread, bot_id: str, first: int) -> tuple[range, float]:
    """Traffic, then the holder of `bot_id` SIGKILLed while turns are in flight and the traffic goes
    on across the takeover; a replacement worker joins. Returns the messages sent and the seconds
    from the kill until the stand-in had a new socket."""
    holder, token = await lease_holder(stack, bot_id)
    assert holder is not None, "nobody holds the connection"
    traffic = Traffic(peer, first)
    traffic.start()
    await asyncio.sleep(3.0)
    # No frame is written in the last moment before the kill: OneBot v11 acknowledges nothing, so a
    # frame in the socket buffer of a process that dies is lost (see docs/operations.md).
    traffic.flowing.clear()
    await asyncio.sleep(0.3)
    sockets_before = len(peer.sockets())
    await holder.kill()
    killed = time.monotonic()
    await wait_for(lambda: not peer.open_sockets(), "the stand-in saw the socket close", 10)
    traffic.flowing.set()  # frames written while no socket is open wait for the next one
    await wait_for(lambda: len(peer.open_sockets()) == 1 and len(peer.sockets()) > sockets_before, "taken over", 60)
    takeover = time.monotonic() - killed
    new_holder, new_token = await lease_holder(stack, bot_id)
    assert new_holder is not None and new_holder is not holder and new_token > token
    await asyncio.sleep(3.0)
    sent = await traffic.stop()
    await add_workers(stack)  # for the tests after this one
    return sent, takeover


# -- tests -----------------------------------------------------------------------------------------


async def test_each_connection_is_held_exactly_once(
    stack: Stack, napcat_server: PeerThread, napcat_client: PeerThread
) -> None:
    await wait_for(lambda: len(napcat_server.open_sockets()) == 1, "forward connection dialed", 30)
    await wait_for(lambda: len(napcat_client.open_sockets()) == 1, "reverse connection accepted", 30)
    await asyncio.sleep(4.0)  # several renewals and acquisition rounds of every worker
    assert len(napcat_server.sockets()) == 1 and len(napcat_client.sockets()) == 1, "no second connection, no flapping"
    running = [w for w in stack.workers if w.is_running]
    assert len(running) >= 2
    for transport, bot_id in (("ws-forward", "fwd"), ("ws-reverse", "rev")):
        held = [
            await metric(w, "switchboard_connections_held", platform="onebot", transport=transport) for w in running
        ]
        assert sorted(held) == [0.0] * (len(running) - 1) + [1.0], (transport, held)
        holder, _ = await lease_holder(stack, bot_id)
        assert holder is not None and held[running.index(holder)] == 1.0
        for worker in running:  # every worker computes it from the leases
            assert await metric(worker, "switchboard_connection_holder_missing", platform="onebot", bot=bot_id) == 0.0
    assert napcat_server.refused == []


async def test_replies_are_sent_over_the_connection_from_a_worker_that_does_not_hold_it(
    stack: Stack, napcat_server: PeerThread
) -> None:
    # One chat per partition of im.outbound.onebot at least: both workers egress some of them.
    partitioner = KeyPartitioner()
    numbers: list[int] = []
    covered: set[int] = set()
    n = 100
    while len(covered) < PARTITIONS or len(numbers) < 8:
        key = f"onebot:fwd:private_{60_000 + n}".encode()
        covered.add(partitioner(key, list(range(PARTITIONS)), list(range(PARTITIONS))))
        numbers.append(n)
        n += 1
    holder, _ = await lease_holder(stack, "fwd")
    assert holder is not None
    others = [w for w in stack.workers if w.is_running and w is not holder]
    sent_before = {
        w.port: await metric(w, "switchboard_egress_total", platform="onebot", outcome="sent") for w in others
    }
    for number in numbers:
        await napcat_server.send_event(event(number, f"m{number}"))
    await wait_for(lambda: set(numbers) <= set(answered(napcat_server)), "every message answered")
    await stack_idle(stack)
    counts = answered(napcat_server)
    assert all(counts[n] == 1 for n in numbers), counts
    routed = {
        w.port: await metric(w, "switchboard_egress_total", platform="onebot", outcome="sent") - sent_before[w.port]
        for w in others
    }
    assert sum(routed.values()) > 0, f"no reply egressed by a worker that does not hold the connection: {routed}"
    for worker in others:
        if routed[worker.port]:
            assert await metric(worker, "switchboard_connections_held", platform="onebot", transport="ws-forward") == 0
            assert (
                await metric(worker, "switchboard_connection_actions_total", platform="onebot", outcome="answered") > 0
            )
    # Every action ran on the one socket of the holder.
    assert {a.socket for a in napcat_server.actions()} == {napcat_server.open_sockets()[0].id}


async def test_forward_holder_sigkilled_mid_traffic_a_survivor_dials_and_every_message_is_answered_once(
    stack: Stack, napcat_server: PeerThread
) -> None:
    sent, takeover = await sigkill_holder_mid_traffic(stack, napcat_server, "fwd", first=1_000)
    print(
        f"\nforward WebSocket: {len(sent)} messages, takeover {takeover:.2f} s after SIGKILL (bound: lease 3 s + 0.5 s)"
    )
    await each_answered_once(stack, napcat_server, sent)
    assert len(napcat_server.open_sockets()) == 1


async def test_reverse_holder_sigkilled_mid_traffic_the_stand_in_reconnects_to_a_survivor(
    stack: Stack, napcat_client: PeerThread
) -> None:
    await wait_for(lambda: len(napcat_client.open_sockets()) == 1, "reverse connection accepted", 30)
    sent, takeover = await sigkill_holder_mid_traffic(stack, napcat_client, "rev", first=2_000)
    print(f"\nreverse WebSocket: {len(sent)} messages, takeover {takeover:.2f} s after SIGKILL (reconnect every 0.5 s)")
    await each_answered_once(stack, napcat_client, sent)
    assert napcat_client.errors == [] and len(napcat_client.open_sockets()) == 1
