"""Controls on the whole pipeline (docs/controls.md): a real broker, a real Redis, the simulator and
TWO workers, each ingesting the chats of its own partitions.

- a user over the turn limit gets one notice and no turn more, across both workers;
- a message the moderation lists match starts no turn (and stays out of the context window);
- an unreachable moderation hook lets messages through or stops them, as each bot says; a live one
  (a stand-in that checks the bearer secret) decides;
- a message whose turn has not started within the bot's bound gets the busy notice instead.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from aiokafka.partitioner import murmur2

from pipeline.bench.measure import metric_sum, scrape_metrics
from pipeline.embedded import RedisServer
from pipeline.records import conversation_key
from pipeline.stack import Stack
from tests.conftest import enabled_brokers
from tests.controls.moderation_hook import ModerationStandIn

from .console import ConsoleClient, texts
from .loop_thread import LoopThread
from .stacks import add_workers, running_stack

pytestmark = [pytest.mark.integration]

PARTITIONS = 4
HOOK_SECRET = "it-moderation-secret-0123"
OVERLOADED_TEXT = "Sorry, I'm too busy to answer that now. Please try again later."
RATE_LIMITED_TEXT = "Too many requests right now; please wait a while before asking again."
MODERATED_TEXT = "Sorry, I can't respond to that message."


def _closed_port() -> int:
    """A local port nothing listens on: the moderation hook there is unreachable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bots_toml(hook_port: int, live_port: int) -> str:
    hook = f'url = "http://127.0.0.1:{hook_port}/moderate"\nsecret = "{HOOK_SECRET}"\ntimeout_seconds = 1'
    return f"""
[[bots]]
platform = "console"
bot_id = "limited"
self_id = "bot"
language = "en"
busy_policy = "queue"
admins = ["boss"]
[bots.limits]
user_turns = {{ count = 3, per_seconds = 3600 }}
[bots.moderation]
words = ["Badword"]
patterns = ["forbid+en"]
inbound = "notice"

[[bots]]
platform = "console"
bot_id = "hook-open"
self_id = "bot"
language = "en"
[bots.moderation]
inbound = "notice"
[bots.moderation.hook]
{hook}
on_failure = "open"

[[bots]]
platform = "console"
bot_id = "hook-closed"
self_id = "bot"
language = "en"
[bots.moderation]
inbound = "notice"
[bots.moderation.hook]
{hook}
on_failure = "closed"

[[bots]]
platform = "console"
bot_id = "hook-live"
self_id = "bot"
language = "en"
[bots.moderation]
inbound = "notice"
[bots.moderation.hook]
url = "http://127.0.0.1:{live_port}/moderate"
secret = "{HOOK_SECRET}"
on_failure = "closed"

[[bots]]
platform = "console"
bot_id = "slow"
self_id = "bot"
language = "en"
busy_policy = "queue"
[bots.overload]
max_wait_seconds = 1
"""


@pytest.fixture(scope="module")
def hook() -> Iterator[ModerationStandIn]:
    thread: LoopThread[ModerationStandIn] = LoopThread(
        "moderation-hook", lambda: ModerationStandIn(HOOK_SECRET).start(), lambda s: s.stop()
    )
    try:
        yield thread.start_loop()
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module", params=enabled_brokers())
def stack(request: pytest.FixtureRequest, redis_server: RedisServer, hook: ModerationStandIn) -> Iterator[Stack]:
    toml = _bots_toml(_closed_port(), hook.port)
    with running_stack(
        request.param, name="ctl", bots_toml=toml, redis_url=redis_server.url, partitions=PARTITIONS
    ) as stack:
        asyncio.run(add_workers(stack))  # two workers: each ingests the chats of its partitions
        assert len(stack.workers) == 2
        yield stack


def _chats_on_every_partition(bot_id: str) -> list[str]:
    """One group chat per partition of `im.inbound` (keyed by conversation, murmur2 as the
    producer does): whatever the assignment, both workers ingest some of them."""
    found: dict[int, str] = {}
    while len(found) < PARTITIONS:
        chat = f"grp-{uuid.uuid4().hex[:10]}"
        key = conversation_key("console", bot_id, chat).encode()
        found.setdefault((murmur2(key) & 0x7FFFFFFF) % PARTITIONS, chat)
    return list(found.values())


async def _sum_over_workers(stack: Stack, name: str, **labels: str) -> list[float]:
    return [metric_sum(await scrape_metrics(w.url), name, **labels) for w in stack.workers]


async def _redis_list(stack: Stack, key: str) -> list[str]:
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        return [str(v) for v in await client.lrange(f"{settings.redis_prefix}{key}", 0, -1)]
    finally:
        await client.aclose()


async def test_a_user_over_the_limit_gets_one_notice_and_no_more_turns_across_both_workers(stack: Stack) -> None:
    console = ConsoleClient(stack, bot_id="limited")
    chats = _chats_on_every_partition("limited")
    before = await _sum_over_workers(stack, "switchboard_rate_limited_total")
    triggered_before = await _sum_over_workers(stack, "switchboard_turns_triggered_total")
    user = f"flood-{uuid.uuid4().hex[:6]}"
    # 8 triggers from one user, two in each chat, sent to both workers' partitions at once.
    await asyncio.gather(
        *(
            console.send(chat, f"question {n}", chat_type="group", user_id=user, mentions=["bot"])
            for n in range(2)
            for chat in chats
        )
    )
    await console.stack_idle()
    answers = [text for chat in chats for text in texts(await console.messages(chat))]
    replies = [t for t in answers if t.startswith("echo: ")]
    notices = [t for t in answers if t == RATE_LIMITED_TEXT]
    assert len(replies) == 3, answers  # the limit: 3 turns per hour for this user, whichever worker
    assert len(notices) == 1, answers  # one notice per window, never one per message
    assert len(answers) == 4, answers  # nothing else
    after = await _sum_over_workers(stack, "switchboard_rate_limited_total")
    triggered = await _sum_over_workers(stack, "switchboard_turns_triggered_total")
    assert sum(after) - sum(before) == 5
    # Both workers ingested some of this user's triggers, and neither let more than 3 through.
    handled = [a - b + t - tb for a, b, t, tb in zip(after, before, triggered, triggered_before, strict=True)]
    assert all(h > 0 for h in handled), handled

    # Still over the limit: commands go through (/stop answers), admins are exempt.
    await console.send(chats[0], "/stop", chat_type="group", user_id=user)
    boss_chat = chats[1]
    for n in range(4):
        await console.send(boss_chat, f"boss asks {n}", chat_type="group", user_id="boss", mentions=["bot"])
    await console.stack_idle()
    assert texts(await console.messages(chats[0]))[-1] == "Stopped."
    boss_replies = [t for t in texts(await console.messages(boss_chat)) if t.startswith("echo: ") and "boss asks" in t]
    assert len(boss_replies) == 4


async def test_a_moderated_message_starts_no_turn_and_stays_out_of_the_context(stack: Stack) -> None:
    console = ConsoleClient(stack, bot_id="limited")
    chat = console.chat("grp")
    user = f"mod-{uuid.uuid4().hex[:6]}"
    await console.send(chat, "what a BADWORD thing", chat_type="group", user_id=user, mentions=["bot"])
    await console.send(chat, "chatter that is forbiddden", chat_type="group", user_id=user)
    await console.stack_idle()
    assert texts(await console.messages(chat)) == [MODERATED_TEXT]
    assert await console.session_of(chat) is None  # no turn, so no session
    window = await _redis_list(stack, f"ctx:console:limited:{chat}")
    assert window == []  # neither the trigger nor the chatter reach the agent as context
    counted = await _sum_over_workers(stack, "switchboard_moderation_total", direction="inbound", reason="list")
    assert sum(counted) >= 1


async def test_an_unreachable_hook_fails_open_or_closed_as_configured(stack: Stack) -> None:
    opened = ConsoleClient(stack, bot_id="hook-open")
    closed = ConsoleClient(stack, bot_id="hook-closed")
    open_chat, closed_chat = opened.chat(), closed.chat()
    await opened.send(open_chat, "hello through")
    await closed.send(closed_chat, "hello stopped")
    await opened.stack_idle()
    assert texts(await opened.messages(open_chat)) == ["echo: hello through"]
    assert texts(await closed.messages(closed_chat)) == [MODERATED_TEXT]
    assert await closed.session_of(closed_chat) is None  # no turn started
    failed = await _sum_over_workers(stack, "switchboard_moderation_total", reason="hook_failed")
    assert sum(failed) == 2


async def test_a_live_hook_is_asked_with_its_secret_once_per_trigger_and_decides(
    stack: Stack, hook: ModerationStandIn
) -> None:
    console = ConsoleClient(stack, bot_id="hook-live")
    chat = console.chat("grp")
    await console.send(chat, "a fine question", chat_type="group", user_id="h1", mentions=["bot"])
    await console.send(chat, "just chatter", chat_type="group", user_id="h2")  # no turn: not asked
    await console.send(chat, "a forbidden question", chat_type="group", user_id="h3", mentions=["bot"])
    await console.stack_idle()
    got = texts(await console.messages(chat))  # the notice may come before the turn's reply
    assert sorted(got) == sorted(["echo: [Ann (h1)] a fine question", MODERATED_TEXT]), got
    asked = [d for d in hook.decided if d["chat_id"] == chat]
    assert [(d["user_id"], d["text"]) for d in asked] == [("h1", "a fine question"), ("h3", "a forbidden question")]
    assert asked[0]["platform"] == "console" and asked[0]["bot_id"] == "hook-live"
    assert hook.refused == 0
    window = await _redis_list(stack, f"ctx:console:hook-live:{chat}")
    assert len(window) == 2 and not any("forbidden" in entry for entry in window)  # taken out again


async def test_a_message_whose_turn_did_not_start_in_time_gets_the_busy_notice(stack: Stack) -> None:
    """Bot `slow` queues while busy and bounds the wait at 1 s: a message held behind a 3 s turn is
    past the bound when that turn ends, so it gets the notice instead of a turn of its own."""
    console = ConsoleClient(stack, bot_id="slow")
    chat = console.chat()
    await console.send(chat, "[sim:think=3] first")
    await console.session_started(chat)  # the first turn is running now
    await console.send(chat, "second, asked while busy")
    await console.stack_idle()
    assert texts(await console.messages(chat)) == ["echo: first", OVERLOADED_TEXT]
    overloaded = await _sum_over_workers(stack, "switchboard_overloaded_total", bot="slow")
    assert sum(overloaded) == 1
