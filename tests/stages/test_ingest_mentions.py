"""Mentions of other people, from a platform's webhook to the turn the agent gets: the names in
its text, and the ids and names of its member list (the prompt's turn context) and of the ids it
may mention back. Ingest runs against a real Redis, with the worker's own prompt builder."""

from __future__ import annotations

import json

import pytest

from pipeline.platforms import WebhookRequest, get_platform
from pipeline.records import InboundMessage, SessionCommand
from pipeline.runtime import reply_context, reply_policy
from pipeline.segments import build_im_prompt
from pipeline.settings import BotConfig, Settings
from pipeline.stages.ingest import IngestStage
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from tests.conftest import connect_state
from tests.platforms import test_lark as lark_fx
from tests.platforms import test_onebot as onebot_fx

from .test_ingest_admit import Recorder, run

pytestmark = pytest.mark.usefixtures("close_connected_states")


def ingest_for(bot: BotConfig, redis_url: str, prefix: str) -> tuple[IngestStage, Recorder]:
    settings = Settings(redis_prefix=prefix, bots=[bot])
    state = connect_state(redis_url, settings.redis_prefix)
    recorder = Recorder()

    def prompt(bot: BotConfig, message: InboundMessage, window: list) -> str | None:
        return build_im_prompt(reply_context(bot, message, window), reply_policy(bot, settings))

    return IngestStage(settings, state, Outputs(recorder), Notifier(settings), prompt), recorder


def received(bot: BotConfig, request: WebhookRequest) -> InboundMessage:
    platform = get_platform(bot.platform)
    platform.verify(bot, request)
    [message] = platform.parse(bot, request).messages
    return message


def turn_members(turn: SessionCommand) -> list[dict[str, str]]:
    assert turn.system_text is not None
    context = json.loads(turn.system_text.rsplit("\n", 1)[-1])
    members: list[dict[str, str]] = context["members"]
    return members


def turn_text(turn: SessionCommand) -> str:
    return str(turn.events[0]["content"][0]["text"])


async def test_onebot_at_is_named_from_who_spoke_in_the_window(redis_url: str, redis_prefix: str) -> None:
    bot = onebot_fx.bot_config()
    ingest, recorder = ingest_for(bot, redis_url, redis_prefix)
    chatter = onebot_fx.group_event(
        "早上好", message_id=3001, user_id=222, sender={"user_id": 222, "nickname": "小明", "role": "member"}
    )
    ask = onebot_fx.group_event(
        [
            {"type": "at", "data": {"qq": "10001000"}},
            {"type": "text", "data": {"text": " 帮我问问 "}},
            {"type": "at", "data": {"qq": "222"}},
            {"type": "text", "data": {"text": " 和 "}},
            {"type": "at", "data": {"qq": "333"}},
        ],
        message_id=3002,
    )
    assert await run(ingest, recorder, [received(bot, onebot_fx.signed(chatter))]) == [False]
    assert await run(ingest, recorder, [received(bot, onebot_fx.signed(ask))]) == [True]
    [turn] = recorder.turns()
    assert turn_text(turn) == "[群名片 (12345678)] 帮我问问 @小明 和 @333"
    # 333 never spoke: listed all the same, first, with the name nobody gave.
    assert turn_members(turn) == [{"user_id": "222", "name": "小明"}, {"user_id": "333", "name": ""}]
    assert set(turn.known_ids) == {"12345678", "222", "333"}


async def test_lark_mention_of_someone_who_never_spoke(redis_url: str, redis_prefix: str) -> None:
    bot = lark_fx.bot_config()
    ingest, recorder = ingest_for(bot, redis_url, redis_prefix)
    bob = "ou_bob00000000000000000000000000003"
    event = lark_fx.receive_event(
        "text",
        {"text": "@_user_1 ping @_user_2"},
        mentions=[lark_fx.mention("@_user_1", lark_fx.BOT_OPEN_ID, "Switch"), lark_fx.mention("@_user_2", bob, "Bob")],
    )
    assert await run(ingest, recorder, [received(bot, lark_fx.encrypted_request(event))]) == [True]
    [turn] = recorder.turns()
    assert turn_text(turn).endswith("] ping @Bob")
    assert turn_members(turn) == [{"user_id": bob, "name": "Bob"}]
    assert turn.known_ids == [lark_fx.ALICE, bob]
