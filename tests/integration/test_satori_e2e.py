"""Satori end to end: events in over the server's WebSocket, replies out over its HTTP API, through a
real broker, Redis, the simulator and two worker processes. The stand-in
(`tests/connections/satori_standin.py`) is the event WebSocket and the HTTP API in one, served from a
thread of its own, with two logins (the bot entry's and another one); the simulator's agent echoes.

Covered: a group message that mentions the bot and a private one, each delivered twice (the same
message id, two `sn`s), answered once in its own channel, quoting the message answered; the other
login's message never answered; the socket's holder SIGKILLed mid-traffic, a survivor takes the lease
and IDENTIFYs with the last durable `sn`, the server sends what came after again, and every message
is answered once.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from satori import At, Element, Image, MessageObject, Quote
from satori import Text as SatoriText

from pipeline.embedded import RedisServer
from pipeline.stack import Stack
from tests.conftest import enabled_brokers
from tests.connections.satori_standin import SatoriStandIn
from tests.platforms.conftest import PNG
from tests.platforms.test_satori import BOT, LOGIN_PLATFORM, OTHER_BOT, TOKEN, login, message_event

from .loop_thread import LoopThread
from .stacks import add_workers, running_stack, stack_idle
from .test_long_connections import (
    TAKEOVER_QUIET_SECONDS,
    SendGap,
    answered_exactly_once,
    kill_noting_answers,
    lease_holder,
    wait_for,
)

pytestmark = [pytest.mark.integration]


class SatoriThread(LoopThread[SatoriStandIn]):
    def __init__(self) -> None:
        async def make() -> SatoriStandIn:
            standin = SatoriStandIn(logins=[login(BOT), login(OTHER_BOT)])
            await standin.start()
            return standin

        async def close(standin: SatoriStandIn) -> None:
            await standin.stop()

        super().__init__("satori-standin", make, close)

    @property
    def it(self) -> SatoriStandIn:
        assert self.standin is not None
        return self.standin

    async def send(self, n: int, *, group: bool, self_id: str = BOT, think: float = 0.0) -> int:
        """`m<n>` from user n in its own channel (a group one mentions the bot); the event's sn."""
        text = f"m{n}" + (f" [sim:think={think}]" if think else "")
        content: list[Element] = [At(BOT), SatoriText(f" {text}")] if group else [SatoriText(text)]
        event = message_event(
            content,
            group=group,
            message_id=message_id(n),
            user_id=f"{22 * 10**17 + n}",
            channel=channel(n, group),
            self_id=self_id,
        )
        return int(await self._on_loop(self.it.send_event(event)))

    async def send_private(self, n: int, content: list[Element]) -> int:
        """A private message `n` with `content` as it is; the event's sn."""
        event = message_event(
            content, group=False, message_id=message_id(n), user_id=f"{22 * 10**17 + n}", channel=channel(n, False)
        )
        return int(await self._on_loop(self.it.send_event(event)))


def channel(n: int, group: bool) -> str:
    return f"{55 * 10**17 + n}" if group else f"private:{22 * 10**17 + n}"


def message_id(n: int) -> str:
    return f"{77 * 10**16 + n}"


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def satori(broker_kind: str) -> Iterator[SatoriThread]:
    thread = SatoriThread()
    thread.start_loop()
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, satori: SatoriThread) -> Iterator[Stack]:
    toml = (
        '[[bots]]\nplatform = "satori"\nbot_id = "st1"\ntransport = "websocket"\n'
        f'self_id = "{BOT}"\napi_base = "{satori.it.url}"\nlanguage = "en"\n'
        f'credentials = {{ token = "{TOKEN}", platform = "{LOGIN_PLATFORM}" }}\n'
    )
    with running_stack(broker_kind, name="satori", bots_toml=toml, redis_url=redis_server.url) as s:
        asyncio.run(add_workers(s))
        yield s


@pytest.fixture(autouse=True)
def _standin_saw_only_valid_requests(satori: SatoriThread) -> Iterator[None]:
    yield
    assert satori.it.errors == [], "requests or frames a Satori server would refuse"


_numbers = itertools.count(1)


def answers(satori: SatoriThread, n: int, group: bool) -> list[list[Any]]:
    """The elements of each message created in n's channel (read with the SDK's parser)."""
    return [
        MessageObject("0", c.seen.json["content"]).message
        for c in satori.it.messages_to(channel(n, group))
        if c.status == 200
    ]


def answered(satori: SatoriThread, numbers: range | list[int], group: bool) -> Counter[int]:
    counts: Counter[int] = Counter()
    for n in numbers:
        for elements in answers(satori, n, group):
            text = "".join(str(e) for e in elements if isinstance(e, SatoriText))
            assert text.startswith("echo: ") and text.endswith(f"m{n}"), elements
            counts[n] += 1
    return counts


async def ready(satori: SatoriThread) -> None:
    await wait_for(lambda: satori.it.open_sockets(), "the event socket is held", 60)


async def test_a_group_mention_and_a_private_message_each_delivered_twice_are_answered_once(
    stack: Stack, satori: SatoriThread
) -> None:
    await ready(satori)
    group, private, other = next(_numbers), next(_numbers), next(_numbers)
    for _ in range(2):  # the server sent each twice (a client's resume overlapping, say)
        await satori.send(group, group=True)
        await satori.send(private, group=False)
    await satori.send(other, group=True, self_id=OTHER_BOT)  # the other login's: not this bot's
    await wait_for(
        lambda: answered(satori, [group], True) == {group: 1} and answered(satori, [private], False) == {private: 1},
        "both answered",
        60,
    )
    await stack_idle(stack)
    assert answered(satori, [group], True) == {group: 1}
    assert answered(satori, [private], False) == {private: 1}
    assert satori.it.messages_to(channel(other, True)) == []
    for n, is_group in ((group, True), (private, False)):
        [elements] = answers(satori, n, is_group)
        assert isinstance(elements[0], Quote) and elements[0].id == message_id(n), elements


async def test_the_holder_sigkilled_mid_traffic_a_survivor_resumes_by_sn_and_every_message_is_answered_once(
    stack: Stack, satori: SatoriThread
) -> None:
    await ready(satori)
    holder, token = await lease_holder(stack, "st1", platform="satori", channel="event")
    assert holder is not None
    identifies_before = len(satori.it.identifies)
    sent: list[int] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():  # straight through the kill: the server keeps what nobody got
            n = next(_numbers)
            await satori.send(n, group=n % 2 == 0, think=1.5)
            sent.append(n)
            await asyncio.sleep(0.15)

    def delivered() -> set[int]:
        ids = {str(e["message"]["id"]) for e in satori.it.events}
        return {n for n in sent if message_id(n) in ids}

    def counts() -> Counter[int]:
        groups = answered(satori, [n for n in sent if n % 2 == 0], True)
        privates = answered(satori, [n for n in sent if n % 2], False)
        return groups + privates

    flowing = asyncio.create_task(traffic())
    await asyncio.sleep(3.0)
    kill = await kill_noting_answers(holder, counts)
    killed = time.monotonic()
    await wait_for(lambda: len(satori.it.identifies) > identifies_before, "a survivor identified", 60)
    takeover = time.monotonic() - killed
    resume = satori.it.identifies[-1]
    assert resume["token"] == TOKEN and isinstance(resume.get("sn"), int), resume
    new_holder, new_token = await lease_holder(stack, "st1", platform="satori", channel="event")
    assert new_holder is not None and new_holder is not holder and new_token > token
    await asyncio.sleep(3.0)
    stop.set()
    await flowing

    # Satori's message.create has no idempotency key.
    resent = await answered_exactly_once(
        stack, range(sent[0], sent[-1] + 1), delivered=delivered, answered=counts, gap=SendGap("satori", kill)
    )
    # What the server sent again: at least what came while nobody held the socket.
    replayed = next(sock.replayed for sock in satori.it.sockets if sock.identify is resume)
    assert replayed > 0
    print(
        f"\nsatori websocket: {len(sent)} messages, takeover {takeover:.2f} s after SIGKILL "
        f"(bound: lease 3 s + 0.5 s), resumed after sn {resume['sn']}: {replayed} events sent again; "
        f"replies accepted as the holder died, before their markers, so sent again: {resent}"
    )
    await stack_idle(stack, quiet=TAKEOVER_QUIET_SECONDS)
    await add_workers(stack)


async def test_an_internal_image_is_read_from_the_server_with_the_token_and_reaches_the_session(
    stack: Stack, satori: SatoriThread
) -> None:
    """An `<img>` whose `src` is the server's `internal:` resource: the worker reads it through the
    server's `/v1/proxy/` with the token, and the session gets its bytes (the simulator's
    `[sim:media]` echo names their type and digest)."""
    await ready(satori)
    n = next(_numbers)
    internal = satori.it.resource(f"internal:{LOGIN_PLATFORM}/{BOT}/attachments/{n}.png", PNG, "image/png")
    await satori.send_private(n, [SatoriText(f"m{n} [sim:media]"), Image(internal)])
    await wait_for(lambda: answers(satori, n, False), "the image message answered", 60)
    await stack_idle(stack)
    [elements] = answers(satori, n, False)
    text = "".join(str(e) for e in elements if isinstance(e, SatoriText))
    assert text == f"echo: m{n} | image image/png sha256:{hashlib.sha256(PNG).hexdigest()[:16]}", elements
    assert satori.it.proxied.count(internal) == 1 and satori.it.proxy_refused == []
