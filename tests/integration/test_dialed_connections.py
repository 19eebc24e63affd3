"""Slack Socket Mode and Lark's long connection with several workers on a real broker and Redis:
each bot's socket held exactly once, taken over when its holder is SIGKILLed mid-traffic, and every
message the platform sent answered exactly once (replies over HTTP to the stand-ins' Web API and
Open API, checked with the checkers of `tests/platforms`).

Unlike OneBot v11, both acknowledge each event, and the holder does so only once the event's
messages are on the broker: the stand-ins (`tests/connections/slack_standin.py`, `lark_standin.py`)
send an event again, on the next socket, when the socket that carried it closed before
acknowledging it, as the platforms do. So traffic goes on right through the kill, and an event the
dead holder had produced but not acknowledged comes twice (ingest keeps one, by event id).

One stack for the module (workers are real processes with the tests' lease of 3 s and acquisition
interval of 0.5 s) with one bot of each. The simulator's agent echoes: `m<n>` is answered `echo: m<n>`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from pipeline.embedded import RedisServer
from pipeline.stack import Stack, WorkerProcess
from tests.conftest import enabled_brokers
from tests.connections.lark_standin import LarkStandIn
from tests.connections.slack_standin import APP_TOKEN, SlackStandIn
from tests.platforms import test_lark as lark_fx
from tests.platforms.test_slack import BOT_TOKEN, BOT_USER, DM, callback

from .loop_thread import LoopThread
from .stacks import add_workers, running_stack
from .test_long_connections import SendGap, answered_exactly_once, kill_noting_answers, lease_holder, metric, wait_for

pytestmark = [pytest.mark.integration]

StandIn = TypeVar("StandIn", bound=SlackStandIn | LarkStandIn)


class StandInThread(LoopThread[StandIn]):
    """A stand-in of `kind` on a thread of its own, started at once."""

    def __init__(self, kind: type[StandIn]) -> None:
        async def make() -> StandIn:
            standin = kind()
            await standin.start()
            return standin

        async def close(standin: StandIn) -> None:
            await standin.stop()

        super().__init__(kind.__name__, make, close)
        self.standin_started: StandIn = self.start_loop()

    def on_loop(self, coro: Coroutine[Any, Any, Any]) -> Awaitable[Any]:
        return self._on_loop(coro)


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def slack(broker_kind: str) -> Iterator[StandInThread[SlackStandIn]]:
    thread = StandInThread(SlackStandIn)
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def lark(broker_kind: str) -> Iterator[StandInThread[LarkStandIn]]:
    thread = StandInThread(LarkStandIn)
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def stack(
    broker_kind: str, redis_server: RedisServer, slack: StandInThread[SlackStandIn], lark: StandInThread[LarkStandIn]
) -> Iterator[Stack]:
    toml = (
        '[[bots]]\nplatform = "slack"\nbot_id = "sm"\ntransport = "socket_mode"\nlanguage = "en"\n'
        f'self_id = "{BOT_USER}"\napi_base = "{slack.standin_started.url}"\n'
        f'credentials = {{ bot_token = "{BOT_TOKEN}", app_token = "{APP_TOKEN}" }}\n\n'
        '[[bots]]\nplatform = "lark"\nbot_id = "lc"\ntransport = "long_connection"\nlanguage = "en"\n'
        f'self_id = "{lark_fx.BOT_OPEN_ID}"\napi_base = "{lark.standin_started.url}"\n'
        f'credentials = {{ app_id = "{lark_fx.APP_ID}", app_secret = "{lark_fx.APP_SECRET}" }}\n'
    )
    with running_stack(broker_kind, name="dial", bots_toml=toml, redis_url=redis_server.url, partitions=4) as s:
        asyncio.run(add_workers(s))
        yield s


@pytest.fixture(autouse=True)
def _stand_ins_saw_only_valid_requests(
    slack: StandInThread[SlackStandIn], lark: StandInThread[LarkStandIn]
) -> Iterator[None]:
    yield
    assert slack.standin_started.errors == [], "requests or acknowledgements Slack would refuse"
    assert lark.standin_started.errors == [], "requests or frames Lark would refuse"


# -- the two platforms, side by side ----------------------------------------------------------------


def slack_event(n: int) -> dict[str, Any]:
    """A DM `m<n>` from its own user in its own channel (one conversation per message)."""
    dm = dict(DM, channel=f"D{n:08d}", user=f"U{n:08d}", text=f"m{n} [sim:think=1.5]", ts=f"1700000000.{n:06d}")
    return callback(dm, event_id=f"Ev{n:08d}")


def lark_event(n: int) -> dict[str, Any]:
    """A p2p text `m<n>` from its own user in its own chat."""
    event = lark_fx.receive_event("text", {"text": f"m{n} [sim:think=1.5]"}, chat_type="p2p", event_id=f"ev-{n:08d}")
    event["event"]["message"].update(message_id=f"om_{n:08d}", chat_id=f"oc_{n:08d}")
    event["event"]["sender"]["sender_id"]["open_id"] = f"ou_{n:08d}"
    return event


def slack_answers(standin: SlackStandIn) -> Counter[int]:
    counts: Counter[int] = Counter()
    for post in list(standin.posts):
        n = int(post["channel"][1:])
        assert post["text"] == f"echo: m{n}", post
        counts[n] += 1
    return counts


def lark_answers(standin: LarkStandIn) -> Counter[int]:
    counts: Counter[int] = Counter()
    for post in list(standin.posts):
        n = int(post["receive_id"].removeprefix("oc_"))
        assert json.loads(post["content"]) == {"text": f"echo: m{n}"}, post
        counts[n] += 1
    return counts


PLATFORMS: dict[str, tuple[str, str, str]] = {  # platform: (bot id, transport, leased channel)
    "slack": ("sm", "socket_mode", "event"),
    "lark": ("lc", "long_connection", "event"),
}


class Platform:
    """What the tests do with either stand-in."""

    def __init__(self, name: str, slack: StandInThread[SlackStandIn], lark: StandInThread[LarkStandIn]) -> None:
        self.name = name
        self.bot_id, self.transport, self.channel = PLATFORMS[name]
        self.thread: StandInThread[Any] = slack if name == "slack" else lark
        self.event: Callable[[int], dict[str, Any]] = slack_event if name == "slack" else lark_event
        self._answers: Callable[[Any], Counter[int]] = slack_answers if name == "slack" else lark_answers

    def sockets(self) -> list[Any]:
        return list(self.thread.standin_started.sockets)

    def open_sockets(self) -> list[Any]:
        return list(self.thread.standin_started.open_sockets())

    def answers(self) -> Counter[int]:
        return self._answers(self.thread.standin_started)

    def posts(self) -> list[dict[str, Any]]:
        return list(self.thread.standin_started.posts)

    def delivered(self) -> set[int]:
        """The messages whose event reached a socket (Slack: in an envelope; Lark: in a data frame)."""
        standin = self.thread.standin_started
        if isinstance(standin, SlackStandIn):
            ids = [e.message["payload"]["event_id"] for e in list(standin.envelopes.values())]
        else:
            ids = [event["header"]["event_id"] for s in list(standin.sockets) for event in list(s.events.values())]
        return {int(i.removeprefix("Ev").removeprefix("ev-")) for i in ids}

    def send(self, n: int) -> Awaitable[Any]:
        return self.thread.on_loop(self.thread.standin_started.send_event(self.event(n)))

    async def holder(self, stack: Stack) -> tuple[WorkerProcess | None, int]:
        return await lease_holder(stack, self.bot_id, platform=self.name, channel=self.channel)


@pytest.fixture(params=sorted(PLATFORMS))
def platform(
    request: pytest.FixtureRequest, slack: StandInThread[SlackStandIn], lark: StandInThread[LarkStandIn]
) -> Platform:
    return Platform(str(request.param), slack, lark)


# -- tests -----------------------------------------------------------------------------------------


async def test_the_socket_is_held_exactly_once(stack: Stack, platform: Platform) -> None:
    await wait_for(lambda: len(platform.open_sockets()) == 1, "socket dialed", 30)
    await asyncio.sleep(4.0)  # several renewals and acquisition rounds of every worker
    assert len(platform.sockets()) == 1, "no second socket, no flapping"
    running = [w for w in stack.workers if w.is_running]
    assert len(running) >= 2
    held = [
        await metric(w, "switchboard_connections_held", platform=platform.name, transport=platform.transport)
        for w in running
    ]
    assert sorted(held) == [0.0] * (len(running) - 1) + [1.0], held
    owner, _ = await platform.holder(stack)
    assert owner is not None and held[running.index(owner)] == 1.0
    for worker in running:
        missing = await metric(
            worker, "switchboard_connection_holder_missing", platform=platform.name, bot=platform.bot_id
        )
        assert missing == 0.0


async def test_holder_sigkilled_mid_traffic_a_survivor_dials_and_every_message_is_answered_once(
    stack: Stack, platform: Platform
) -> None:
    await wait_for(lambda: len(platform.open_sockets()) == 1, "socket dialed", 30)
    owner, token = await platform.holder(stack)
    assert owner is not None
    sockets_before = len(platform.sockets())
    first = 1 if platform.name == "slack" else 10_001
    sent: list[int] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        n = first
        while not stop.is_set():  # straight through the kill: unacknowledged events come again
            await platform.send(n)
            sent.append(n)
            n += 1
            await asyncio.sleep(0.15)

    flowing = asyncio.create_task(traffic())
    await asyncio.sleep(3.0)
    kill = await kill_noting_answers(owner, platform.answers)
    killed = time.monotonic()
    await wait_for(lambda: len(platform.sockets()) > sockets_before and len(platform.open_sockets()) == 1, "taken over")
    takeover = time.monotonic() - killed
    new_owner, new_token = await platform.holder(stack)
    assert new_owner is not None and new_owner is not owner and new_token > token
    await asyncio.sleep(3.0)
    stop.set()
    await flowing

    # Slack's chat.postMessage has no idempotency key; Lark's send carries a `uuid` (no repeat at all).
    gap = SendGap("slack", kill) if platform.name == "slack" else None
    resent = await answered_exactly_once(
        stack, range(first, sent[-1] + 1), delivered=platform.delivered, answered=platform.answers, gap=gap
    )
    standin = platform.thread.standin_started
    if isinstance(standin, SlackStandIn):
        again = sum(1 for e in list(standin.envelopes.values()) if e.message.get("retry_attempt"))
        acked = {standin.envelopes[e].message["payload"]["event_id"] for e in standin.acked()}
        assert {f"Ev{n:08d}" for n in sent} <= acked, "every event acknowledged once durable"
    else:
        again = standin.pushed_again
        dropped = len(standin.open_api.repeated)
        print(f"\nlark: {dropped} sends repeated with a uuid Lark already posted (Lark drops them)")
        answered = {a.message_id for s in standin.sockets for a in s.answers if a.code == 200}
        events = {s.events[m]["header"]["event_id"] for s in standin.sockets for m in s.events if m in answered}
        assert {f"ev-{n:08d}" for n in sent} <= events, "every event answered 200 once durable"
    print(
        f"\n{platform.name} {platform.transport}: {len(sent)} messages, takeover {takeover:.2f} s after SIGKILL "
        f"(bound: lease 3 s + 0.5 s), {again} sent again after the holder died without acknowledging them; "
        f"replies accepted as the holder died, before their markers, so sent again: {resent}"
    )
    await add_workers(stack)  # for the tests after this one
