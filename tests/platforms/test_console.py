"""The console platform's webhook parsing and rendering (no network: parse and render are pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.addressing import trigger_reason
from pipeline.platforms.base import WebhookRequest
from pipeline.platforms.console import ConsolePlatform, mention_segments
from pipeline.platforms.exceptions import WebhookRejected
from pipeline.records import InboundMessage, OutboundMessage
from pipeline.segments.models import MentionData, MentionSegment, TextData, TextSegment
from pipeline.settings import BotConfig
from pipeline.stages.ingest import content_blocks

BOT = BotConfig.model_validate({"platform": "console", "bot_id": "demo", "self_id": "bot", "language": "en"})


def parse(**fields: Any) -> tuple[InboundMessage, dict[str, Any]]:
    body = {"chat_id": "team", "chat_type": "group", "user_id": "alice", "user_name": "Alice"} | fields
    result = ConsolePlatform().parse(BOT, WebhookRequest(headers={}, body=json.dumps(body).encode()))
    (message,) = result.messages
    return message, result.body


def m(target: str) -> MentionSegment:
    return MentionSegment(type="mention", data=MentionData(target=target))


def t(text: str) -> TextSegment:
    return TextSegment(type="text", data=TextData(text=text))


def test_a_typed_bot_mention_is_a_real_mention_and_triggers() -> None:
    """The README says "mention the bot with @bot": typed, not only through the page's button."""
    message, answer = parse(text="@bot hello, are you there?")
    assert message.mentions == ["bot"] and message.mentions_bot
    assert message.segments == [m("bot"), t(" hello, are you there?")]
    assert trigger_reason(message, BOT) == "mention"
    assert answer["addressed"] is True
    assert content_blocks(message, BOT, label_sender=False)[0]["text"] == "hello, are you there?"


@pytest.mark.parametrize(
    "text",
    ["mail me at me@bot.com", "see @bot.com", "@botany is a science", "@bot-2 is another one", "no mention"],
)
def test_what_only_looks_like_a_bot_mention_is_text(text: str) -> None:
    message, answer = parse(text=text)
    assert message.mentions == [] and not message.mentions_bot
    assert message.segments == [t(text)]
    assert answer["addressed"] is False


def test_mentions_written_in_the_text_stay_in_their_place() -> None:
    message, _ = parse(text="hey @carol, look at this. @bob.", mentions=["carol", "bob", "dave"])
    assert message.segments == [m("dave"), t("hey "), m("carol"), t(", look at this. "), m("bob"), t(".")]
    assert message.mentions == ["carol", "bob", "dave"]
    assert message.text == "hey @carol, look at this. @bob."


def test_a_mention_chip_before_the_text_does_not_glue_to_it() -> None:
    """What the page sent before typed mentions: chips first, then the text."""
    message, _ = parse(text="hey, look at this", mentions=["alice", "bot"])
    assert message.segments == [m("alice"), m("bot"), t("hey, look at this")]
    blocks = content_blocks(message, BOT, label_sender=True, names={"alice": "alice"})
    assert blocks[0]["text"] == "[Alice (alice)] @alice hey, look at this"


def test_the_longest_id_wins_and_a_message_of_mentions_only_keeps_a_text() -> None:
    assert mention_segments("@bob @bobby", ["bob", "bobby"]) == [m("bob"), t(" "), m("bobby")]
    assert mention_segments("@bob", ["bob"]) == [m("bob"), t("")]
    assert mention_segments("", ["bob"]) == [m("bob"), t("")]


@pytest.mark.parametrize(
    ("fields", "addressed"),
    [
        ({"text": "just chatting"}, False),
        ({"text": "hi", "mentions": ["bot"]}, True),
        ({"text": "/allow"}, True),
        ({"text": "/stop"}, True),
        ({"text": "thanks", "reply_to": "out-123"}, True),  # a reply to the bot
        ({"text": "thanks", "reply_to": "web-123"}, False),  # a reply to a person
        ({"text": "anything", "chat_type": "private"}, True),
    ],
)
def test_the_answer_says_whether_the_message_reaches_the_agent(fields: dict[str, Any], addressed: bool) -> None:
    _, answer = parse(**fields)
    assert answer["addressed"] is addressed


def test_a_bad_body_is_refused_by_name() -> None:
    with pytest.raises(WebhookRejected) as refused:
        parse(text="x", mentions="bot")
    assert refused.value.status == 400 and refused.value.reason == "malformed"


def test_notes_of_a_reply_reach_the_page_and_only_when_there_are_some() -> None:
    def outbound(**extra: Any) -> OutboundMessage:
        return OutboundMessage(
            outbound_id="out-1",
            kind="reply",
            platform="console",
            bot_id="demo",
            chat_id="team",
            chat_type="group",
            conversation_key="console:demo:team",
            segments=[t("fixed")],
            **extra,
        )

    (call,) = ConsolePlatform().render(BOT, outbound(notes=["corrected"]))
    assert call.json is not None and call.json["notes"] == ["corrected"]
    (call,) = ConsolePlatform().render(BOT, outbound(notes=["refused"], media_rejected=["too_large", "timeout"]))
    assert call.json is not None and call.json["notes"] == ["refused"]
    assert call.json["media_rejected"] == ["too_large", "timeout"]
    (call,) = ConsolePlatform().render(BOT, outbound())
    assert call.json is not None and "notes" not in call.json and "media_rejected" not in call.json
    # A record without notes is written as before (older workers read it).
    assert {"notes", "media_rejected"}.isdisjoint(json.loads(outbound().model_dump_json()))
