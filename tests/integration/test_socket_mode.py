"""Slack Socket Mode with several workers on a real broker and Redis: the bot's socket held exactly
once, taken over when its holder is SIGKILLed mid-traffic, and every message Slack sent answered
exactly once (through the Web API stand-in, checked with `check_slack`).

Unlike OneBot v11, Socket Mode acknowledges each envelope: the stand-in (`tests/connections/
slack_standin.py`) sends an event again, on the next socket, when the socket that carried it closed
before acknowledging it, as Slack does. So traffic goes on right through the kill, and an event the
dead holder had produced but not acknowledged comes twice (ingest keeps one, by event id).

One stack for the module (workers are real processes with the default lease of 6 s and acquisition
interval of 1 s). The simulator's agent echoes: a message `m<n>` is answered `echo: m<n>`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from pipeline.embedded import RedisServer
from pipeline.stack import Stack, WorkerProcess
from tests.conftest import enabled_brokers
from tests.connections.slack_standin import APP_TOKEN, SlackStandIn
from tests.platforms.test_slack import BOT_TOKEN, BOT_USER, DM, callback

from .stacks import running_stack
from .test_long_connections import lease_holder, metric, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class SlackThread:
    """The stand-in on a thread with its own loop: it outlives each test's loop, and the workers
    (other processes) reach it the whole time."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="slack-standin", daemon=True)
        self._thread.start()

        async def make() -> SlackStandIn:
            standin = SlackStandIn()
            await standin.start()
            return standin

        self.slack: SlackStandIn = self.run(make())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def stop(self) -> None:
        try:
            self.run(self.slack.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def slack(broker_kind: str) -> Iterator[SlackThread]:
    thread = SlackThread()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, slack: SlackThread) -> Iterator[Stack]:
    toml = (
        '[[bots]]\nplatform = "slack"\nbot_id = "sm"\ntransport = "socket_mode"\nlanguage = "en"\n'
        f'self_id = "{BOT_USER}"\napi_base = "{slack.slack.url}"\n'
        f'credentials = {{ bot_token = "{BOT_TOKEN}", app_token = "{APP_TOKEN}" }}\n'
    )
    with running_stack(broker_kind, name="sock", bots_toml=toml, redis_url=redis_server.url, partitions=4) as s:
        asyncio.run(s.add_worker())
        yield s


@pytest.fixture(autouse=True)
def _stand_in_saw_only_valid_requests(slack: SlackThread) -> Iterator[None]:
    yield
    assert slack.slack.errors == [], "requests or acknowledgements Slack would refuse"


def event(n: int) -> dict[str, Any]:
    """A DM `m<n>` from its own user in its own channel (one conversation per message)."""
    dm = dict(DM, channel=f"D{n:08d}", user=f"U{n:08d}", text=f"m{n} [sim:think=1.5]", ts=f"1700000000.{n:06d}")
    return callback(dm, event_id=f"Ev{n:08d}")


def answered(slack: SlackStandIn) -> Counter[int]:
    counts: Counter[int] = Counter()
    for post in list(slack.posts):
        n = int(post["channel"][1:])
        assert post["text"] == f"echo: m{n}", post
        counts[n] += 1
    return counts


async def holder(stack: Stack) -> tuple[WorkerProcess | None, int]:
    return await lease_holder(stack, "sm", platform="slack", channel="event")


async def test_the_socket_is_held_exactly_once(stack: Stack, slack: SlackThread) -> None:
    standin = slack.slack
    await wait_for(lambda: len(standin.open_sockets()) == 1, "socket dialed", 30)
    await asyncio.sleep(4.0)  # several renewals and acquisition rounds of every worker
    assert len(standin.sockets) == 1 and len(standin.opens) == 1, "no second socket, no flapping"
    running = [w for w in stack.workers if w.is_running]
    assert len(running) >= 2
    held = [await metric(w, "switchboard_connections_held", platform="slack", transport="socket_mode") for w in running]
    assert sorted(held) == [0.0] * (len(running) - 1) + [1.0], held
    owner, _ = await holder(stack)
    assert owner is not None and held[running.index(owner)] == 1.0
    for worker in running:
        assert await metric(worker, "switchboard_connection_holder_missing", platform="slack", bot="sm") == 0.0


async def test_holder_sigkilled_mid_traffic_a_survivor_dials_and_every_message_is_answered_once(
    stack: Stack, slack: SlackThread
) -> None:
    standin = slack.slack
    await wait_for(lambda: len(standin.open_sockets()) == 1, "socket dialed", 30)
    owner, token = await holder(stack)
    assert owner is not None
    sockets_before = len(standin.sockets)
    sent: list[int] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        n = 1
        while not stop.is_set():  # straight through the kill: unacknowledged events come again
            await slack.on_loop(standin.send_event(event(n)))
            sent.append(n)
            n += 1
            await asyncio.sleep(0.15)

    flowing = asyncio.create_task(traffic())
    await asyncio.sleep(3.0)
    await owner.kill()
    killed = time.monotonic()
    await wait_for(lambda: len(standin.sockets) > sockets_before and len(standin.open_sockets()) == 1, "taken over")
    takeover = time.monotonic() - killed
    new_owner, new_token = await holder(stack)
    assert new_owner is not None and new_owner is not owner and new_token > token
    await asyncio.sleep(3.0)
    stop.set()
    await flowing
    again = sum(1 for e in list(standin.envelopes.values()) if e.message.get("retry_attempt"))
    print(
        f"\nSocket Mode: {len(sent)} messages, takeover {takeover:.2f} s after SIGKILL (bound: lease 6 s + 1 s), "
        f"{again} sent again after the holder died without acknowledging them"
    )

    await wait_for(lambda: set(sent) <= set(answered(standin)), f"every message answered ({len(sent)})", 120)
    quiet_since, count = time.monotonic(), len(standin.posts)
    while time.monotonic() - quiet_since < 6.0:  # a repeat would come within this
        await asyncio.sleep(0.1)
        if len(standin.posts) != count:
            quiet_since, count = time.monotonic(), len(standin.posts)
    counts = answered(standin)
    assert [n for n in sent if counts[n] != 1] == [], {n: counts[n] for n in sent if counts[n] != 1}
    # Every event was acknowledged on some socket once its messages were on the broker.
    acked_events = {standin.envelopes[e].message["payload"]["event_id"] for e in standin.acked()}
    assert {f"Ev{n:08d}" for n in sent} <= acked_events
    await stack.add_worker()
