"""Telegram `getUpdates` long polling with two workers on a real broker and Redis: the bot polled by
exactly one worker, its holder SIGKILLed mid-traffic, the other taking over from the offset
committed in Redis, and every update answered exactly once (a reply Telegram accepted in the moment
the holder died, before egress marked it delivered, is the one repeat allowed: sendMessage has no
idempotency key; `SendGap` checks that it is that and nothing else).

The stand-in Bot API (`tests/connections/telegram_bot_api.py`) checks every request as Telegram
does and counts `conflicts`: a getUpdates that ended another one whose poller was still connected
(two pollers at once). The simulator's agent echoes: `m<n>` from user 60000+n is answered
`echo: m<n>` in that user's chat, by sendMessage on the same stand-in.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.embedded import RedisServer
from pipeline.stack import Stack
from tests.conftest import enabled_brokers
from tests.connections.telegram_bot_api import USER_BASE, BotApi
from tests.platforms.test_telegram import TOKEN

from .loop_thread import LoopThread
from .stacks import add_workers, running_stack
from .test_long_connections import (
    Kill,
    SendGap,
    answered_exactly_once,
    kill_noting_answers,
    lease_holder,
    metric,
    wait_for,
)

pytestmark = [pytest.mark.integration]

BOT_ID = "tgp"


class BotApiThread(LoopThread[BotApi]):
    def __init__(self) -> None:
        super().__init__("bot-api", BotApi().start, BotApi.stop)

    @property
    def api(self) -> BotApi | None:
        return self.standin

    async def add_text(self, n: int, text: str) -> None:
        """Queue a private text message `text` from user 60000+n (on the stand-in's loop)."""
        api = self.api
        assert api is not None

        async def add() -> None:
            api.add(api.private_text(n, text))

        await self._on_loop(add())


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def bot_api(broker_kind: str) -> Iterator[BotApiThread]:
    thread = BotApiThread()
    thread.start_loop()
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, bot_api: BotApiThread) -> Iterator[Stack]:
    assert bot_api.api is not None
    toml = (
        f'[[bots]]\nplatform = "telegram"\nbot_id = "{BOT_ID}"\ntransport = "polling"\n'
        f'api_base = "{bot_api.api.url}"\npoll_timeout_seconds = 2\nself_id = "777"\nusername = "switch_bot"\n'
        f'language = "en"\ncredentials = {{ token = "{TOKEN}" }}\n'
    )
    with running_stack(broker_kind, name="poll", bots_toml=toml, redis_url=redis_server.url) as s:
        asyncio.run(add_workers(s))
        yield s


@pytest.fixture(autouse=True)
def _stand_in_saw_only_valid_requests(bot_api: BotApiThread) -> Iterator[None]:
    yield
    assert bot_api.api is not None
    assert bot_api.api.errors == [], "requests Telegram would refuse"
    assert bot_api.api.conflicts == 0, "two pollers for one token at once"


def answered(bot_api: BotApiThread) -> Counter[int]:
    """Replies per message number (`echo: m<n>` in the chat of user 60000+n)."""
    assert bot_api.api is not None
    counts: Counter[int] = Counter()
    for reply in list(bot_api.api.replies):
        n = int(reply["chat_id"]) - USER_BASE
        assert reply["text"] == f"echo: m{n}", (reply, n)
        counts[n] += 1
    return counts


def delivered(bot_api: BotApiThread) -> set[int]:
    """Message numbers whose update a poll returned."""
    assert bot_api.api is not None
    return {chat - USER_BASE for chat in bot_api.api.served_chats()}


async def test_the_bot_is_polled_by_exactly_one_worker(stack: Stack, bot_api: BotApiThread) -> None:
    assert bot_api.api is not None
    await wait_for(lambda: len(bot_api.api.polls) >= 2, "polling", 30)
    await asyncio.sleep(4.0)  # several renewals and acquisition rounds of every worker
    running = [w for w in stack.workers if w.is_running]
    assert len(running) == 2
    held = [await metric(w, "switchboard_connections_held", platform="telegram", transport="polling") for w in running]
    assert sorted(held) == [0.0, 1.0], held
    holder, _ = await lease_holder(stack, BOT_ID, platform="telegram", channel="event")
    assert holder is not None and held[running.index(holder)] == 1.0
    for worker in running:
        assert await metric(worker, "switchboard_connection_holder_missing", platform="telegram", bot=BOT_ID) == 0.0
    assert await metric(holder, "switchboard_connection_poll_errors_total", platform="telegram") == 0.0


async def test_holder_sigkilled_mid_traffic_the_other_polls_on_and_every_update_is_answered_once(
    stack: Stack, bot_api: BotApiThread
) -> None:
    holder, token = await lease_holder(stack, BOT_ID, platform="telegram", channel="event")
    assert holder is not None, "nobody polls"
    numbers = iter(range(1, 10_000))
    sent: list[int] = []

    async def traffic(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            n = next(numbers)
            await bot_api.add_text(n, f"m{n} [sim:think=1.5]")
            sent.append(n)
            await asyncio.sleep(0.15)

    await traffic(3.0)
    kill = await kill_noting_answers(holder, lambda: answered(bot_api))
    killed = time.monotonic()
    # Updates keep coming while nobody polls: Telegram keeps them.
    taking_over = asyncio.create_task(traffic(4.0))

    async def new_holder() -> bool:
        worker, new_token = await lease_holder(stack, BOT_ID, platform="telegram", channel="event")
        return worker is not None and worker is not holder and new_token > token

    deadline = time.monotonic() + 60
    while not await new_holder():
        assert time.monotonic() < deadline, "no worker took the bot over"
        await asyncio.sleep(0.1)
    takeover = time.monotonic() - killed
    await taking_over
    await traffic(2.0)
    assert bot_api.api is not None
    again = sum(1 for count in bot_api.api.served.values() if count > 1)
    print(
        f"\nTelegram polling: {len(sent)} updates, taken over {takeover:.2f} s after SIGKILL (lease 3 s + 0.5 s); "
        f"{again} read again by the new holder (not committed by the old one)"
    )
    await wait_for(lambda: set(sent) <= delivered(bot_api), "every update polled", 30)
    resent = await answered_exactly_once(
        stack,
        range(sent[0], sent[-1] + 1),
        delivered=lambda: delivered(bot_api),
        answered=lambda: answered(bot_api),
        gap=SendGap("telegram", kill),  # sendMessage has no idempotency key
    )
    if resent:
        print(f"sent again: the replies to {resent}, which Telegram accepted as the holder died, before their markers")
    await wait_for(lambda: bot_api.api.pending == [], "every update confirmed", 30)
    await add_workers(stack)  # as many workers as before, for any test after this one


async def test_a_reply_accepted_as_its_sender_dies_is_the_one_reply_sent_again(
    stack: Stack, bot_api: BotApiThread
) -> None:
    """The repeat `SendGap` allows, made to happen: every worker SIGKILLed the moment Telegram
    accepted a reply, before egress could mark it delivered. The replay sends that reply again (the
    same one: one outbound id in its conversation), and the gap explains it."""
    api = bot_api.api
    assert api is not None
    n = 1_000  # a chat none of the other tests uses
    victims = [w for w in stack.workers if w.is_running]
    killed: list[int] = []

    def kill_every_worker(params: dict[str, Any]) -> None:
        if not killed and params["chat_id"] == USER_BASE + n:
            for worker in victims:
                worker.kill_now()  # before the stand-in answers: the answer never reaches the sender
            killed.append(n)

    settled = answered(bot_api)
    api.on_reply = kill_every_worker
    try:
        await bot_api.add_text(n, f"m{n}")
        await wait_for(lambda: bool(killed), "the reply accepted", 60)
    finally:
        api.on_reply = None
    kill = Kill(settled, answered(bot_api))
    await add_workers(stack, len(victims))
    resent = await answered_exactly_once(
        stack,
        range(n, n + 1),
        delivered=lambda: delivered(bot_api),
        answered=lambda: answered(bot_api),
        gap=SendGap("telegram", kill),
    )
    assert resent == [n]
