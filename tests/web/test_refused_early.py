"""Triggers over a turn limit refused at the edge (pipeline/stages/refused_early.py): once the
worker's ingest has found a chat (a user) over its limit, the worker's webhooks and held connections
drop that chat's later triggers before they are `im.inbound` records, until the window ends; what
ingest would not drop silently still goes through. On a real Redis, with the worker's own runtime."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from prometheus_client import REGISTRY

from pipeline.connections import InboundSink
from pipeline.platforms import get_platform
from pipeline.records import InboundMessage, Sender
from pipeline.settings import BotConfig
from pipeline.stages.outputs import Outputs
from pipeline.stages.refused_early import EarlyRefusals
from pipeline.stages.work import run_remaining
from pipeline.topics import IM_INBOUND, SESSION_INPUT
from tests.platforms import test_onebot as onebot_fx
from tests.platforms.test_ingress_checks import Produced

from .conftest import StartWorker

HOUR = {"count": 1, "per_seconds": 3600}


def onebot_bot(**extra: Any) -> BotConfig:
    return onebot_fx.bot_config(admins=["777"], **extra)


def group_message(message_id: int, text: str, *, group: int = 123456, user: int = 12345678) -> dict[str, Any]:
    """A OneBot group message from a member (not a group admin: those are exempt)."""
    sender = {"user_id": user, "nickname": "n", "card": "", "role": "member"}
    return onebot_fx.group_event(text, message_id=message_id, group_id=group, user_id=user, sender=sender)


async def post(url: str, event: dict[str, Any]) -> int:
    """A signed OneBot webhook to the worker at `url`: the status it answered."""
    request = onebot_fx.signed(event)
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{url}/webhooks/onebot/qq1", content=request.body, headers=dict(request.headers))
    return response.status_code


def rate_limited(scope: str, outcome: str) -> float:
    labels = {"platform": "onebot", "bot": "qq1", "scope": scope, "outcome": outcome}
    return REGISTRY.get_sample_value("switchboard_rate_limited_total", labels) or 0.0


async def test_a_chat_over_its_limit_is_refused_at_the_webhook_until_its_window_ends(start_worker: StartWorker) -> None:
    worker = await start_worker(bots=[onebot_bot(limits={"chat_turns": HOUR})])
    ingest = worker.runtime.ingest
    produced = worker.produced
    ingested = 0

    async def ingest_new() -> None:
        """What the webhooks produced since the last call, through the worker's ingest."""
        nonlocal ingested
        records = produced.on(IM_INBOUND)[ingested:]
        ingested += len(records)
        for work in await ingest.admit([InboundMessage.model_validate_json(v) for v in records]):
            await run_remaining(work)

    mention = "[CQ:at,qq=10001000] "
    # The chat's one turn of the hour, then the message ingest refuses with the window's notice.
    for n in (1, 2):
        assert await post(worker.url, group_message(n, mention + f"question {n}")) == 200
        await ingest_new()
    assert len(produced.on(SESSION_INPUT)) == 1
    assert len(produced.on(IM_INBOUND)) == 2 and len(worker.runtime.refusals) == 1
    before = rate_limited("chat", "limited")
    # From now on in this hour the chat's triggers stop at the webhook: answered 200, not produced.
    assert await post(worker.url, group_message(3, mention + "question 3")) == 200
    assert await post(worker.url, group_message(4, mention + "question 4", user=999)) == 200
    assert len(produced.on(IM_INBOUND)) == 2
    assert rate_limited("chat", "limited") == before + 2
    # What ingest would not drop without a word still goes to it: a command, the bot's admin,
    # chatter (context for the next turn), and another chat.
    assert await post(worker.url, group_message(5, "/stop")) == 200
    assert await post(worker.url, group_message(6, mention + "admin here", user=777)) == 200
    assert await post(worker.url, group_message(7, "just chatting")) == 200
    assert await post(worker.url, group_message(8, mention + "other chat", group=654321)) == 200
    texts = [json.loads(v)["text"] for v in produced.on(IM_INBOUND)[2:]]
    assert texts == ["/stop", "admin here", "just chatting", "other chat"]
    await ingest_new()
    assert len(produced.on(SESSION_INPUT)) == 4  # the interrupt, the admin's turn, the other chat's turn


async def test_what_one_workers_ingest_refused_is_refused_at_every_workers_edge(start_worker: StartWorker) -> None:
    """A webhook may reach any worker; the chat's partition (its ingest) is one worker's."""
    config = onebot_bot(limits={"chat_turns": HOUR})
    first, second = await start_worker(bots=[config]), await start_worker(bots=[config])
    await asyncio.wait_for(second.runtime.refusal_broadcast.subscribed.wait(), 10)
    mention = "[CQ:at,qq=10001000] "
    for n in (1, 2):  # the chat's one turn of the hour, then the message refused with the notice
        event = group_message(n, mention + f"question {n}")
        for work in await first.runtime.ingest.admit(onebot_fx.parse(event, admins=["777"]).messages):
            await run_remaining(work)
    assert len(first.produced.on(SESSION_INPUT)) == 1 and len(first.runtime.refusals) == 1
    for _ in range(100):
        if len(second.runtime.refusals):
            break
        await asyncio.sleep(0.05)
    assert len(second.runtime.refusals) == 1
    assert await post(second.url, group_message(3, mention + "question 3")) == 200
    assert second.produced.on(IM_INBOUND) == []


def test_an_entry_from_another_worker_is_checked_before_it_is_learnt() -> None:
    refusals = EarlyRefusals()
    now = 1_000_000
    for junk in ("not json", "[1, 2]", '["onebot:qq1", "planet", "g", 1000500]', '["onebot:qq1", "chat", "g", 999]'):
        assert not refusals.learn(junk, now)
    assert not refusals.learn(json.dumps(["onebot:qq1", "chat", "g", now + 40 * 86_400_000]), now)  # no such window
    assert len(refusals) == 0
    assert refusals.learn(json.dumps(["onebot:qq1", "chat", "g", now + 5000]), now)
    assert refusals.refuses(onebot_bot(limits={"chat_turns": HOUR}), message(chat="g"), now) == "chat"


def message(
    user: str = "u1", chat: str = "g", text: str = "@bot hi", *, mention: bool = True, admin: bool = False
) -> InboundMessage:
    return InboundMessage(
        platform="onebot",
        bot_id="qq1",
        chat_id=chat,
        chat_type="group",
        sender=Sender(user_id=user, is_admin=admin),
        message_id="m1",
        text=text,
        mentions_bot=mention,
        conversation_key=f"onebot:qq1:{chat}",
        trace_id="t",
    )


def test_each_scope_refuses_its_own_subject_and_the_entry_ends_before_its_window() -> None:
    bot = onebot_bot(
        limits={"user_turns": HOUR, "chat_turns": HOUR, "bot_turns": {"count": 5, "per_seconds": 10}},
        moderation={"words": ["spam"]},
    )
    refusals = EarlyRefusals()
    start = 3_600_000 * 100  # an hour's window starts here
    refusals.note(bot, message(user="u1", chat="g"), "user", start + 5)
    refusals.note(bot, message(user="u2", chat="h"), "chat", start + 5)
    refusals.note(bot, message(user="u3", chat="k"), "bot", start + 5)  # the bot's, told per chat
    now = start + 1000
    assert refusals.refuses(bot, message(user="u1", chat="x"), now) == "user"
    assert refusals.refuses(bot, message(user="u9", chat="h"), now) == "chat"
    assert refusals.refuses(bot, message(user="u9", chat="k"), now) == "bot"
    assert refusals.refuses(bot, message(user="u9", chat="other"), now) is None  # its chat not told yet
    # What ingest does not drop silently: a command, an admin (configured or as the platform says),
    # chatter, a message the moderation lists match (moderated first).
    assert refusals.refuses(bot, message(user="u1", text="/reset"), now) is None
    assert refusals.refuses(bot, message(user="777"), now) is None
    assert refusals.refuses(bot, message(user="u1", admin=True), now) is None
    assert refusals.refuses(bot, message(user="u1", text="hi all", mention=False), now) is None
    assert refusals.refuses(bot, message(user="u1", text="@bot spam"), now) is None
    # The bot window (10 s) ends its entry a second early (a tenth of the window); the hour's, a second early.
    assert refusals.refuses(bot, message(user="u9", chat="k"), start + 8_999) == "bot"
    assert refusals.refuses(bot, message(user="u9", chat="k"), start + 9_000) is None
    assert refusals.refuses(bot, message(user="u1"), start + 3_598_999) == "user"
    assert refusals.refuses(bot, message(user="u1"), start + 3_599_000) is None


def test_a_bot_that_holds_what_is_over_is_left_to_ingest_and_the_memo_stays_bounded() -> None:
    held = onebot_bot(limits={"chat_turns": HOUR, "over_limit": "hold"})
    refusals = EarlyRefusals(max_entries=2)
    refusals.note(held, message(), "chat", 0)
    assert len(refusals) == 0  # its messages over the limit are kept as context: ingest's work
    dropping = onebot_bot(limits={"chat_turns": HOUR})
    for chat in ("a", "b", "c"):
        refusals.note(dropping, message(chat=chat), "chat", 0)
    assert len(refusals) == 2
    assert refusals.refuses(dropping, message(chat="a"), 1) is None  # the oldest went first
    assert refusals.refuses(dropping, message(chat="c"), 1) == "chat"


async def test_a_held_connections_frame_over_the_limit_is_not_produced() -> None:
    bot = onebot_bot(limits={"chat_turns": HOUR})
    refusals = EarlyRefusals()
    produced = Produced()

    async def send(topic: str, key: str | None, value: bytes) -> None:
        await produced(topic, key, value)

    sink = InboundSink(send, Outputs(produced), refusals=refusals)
    platform = get_platform("onebot")
    frame = json.dumps(group_message(1, "[CQ:at,qq=10001000] hi")).encode()
    assert (await (await sink.submit(bot, platform, frame))).produced == 1
    [record] = produced.on(IM_INBOUND)
    refusals.note(bot, InboundMessage.model_validate_json(record), "chat", int(time.time() * 1000))
    outcome = await (await sink.submit(bot, platform, frame.replace(b'"message_id": 1', b'"message_id": 2')))
    assert outcome.ignored == "rate_limited" and len(produced.on(IM_INBOUND)) == 1
