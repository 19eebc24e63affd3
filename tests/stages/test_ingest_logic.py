"""Ingest's pure decisions: triggers, chat commands, content blocks, who may answer."""

from __future__ import annotations

import pytest

from pipeline.addressing import parse_chat_command, trigger_reason
from pipeline.records import InboundMessage, ReplyRef, Sender
from pipeline.segments.models import MentionData, MentionSegment, TextData, TextSegment
from pipeline.settings import BotConfig, TriggerPolicy
from pipeline.stages.ingest import content_blocks, may_answer


def bot(**overrides: object) -> BotConfig:
    return BotConfig(platform="console", bot_id="b", self_id="bot", **overrides)


def message(text: str = "hi", *, chat_type: str = "group", **overrides: object) -> InboundMessage:
    fields: dict[str, object] = {
        "platform": "console",
        "bot_id": "b",
        "chat_id": "c",
        "chat_type": chat_type,
        "sender": Sender(user_id="u1", name="Ann"),
        "message_id": "m1",
        "text": text,
        "segments": [TextSegment(type="text", data=TextData(text=text))],
        "conversation_key": "console:b:c",
        "trace_id": "t",
    }
    fields.update(overrides)
    return InboundMessage.model_validate(fields)


def test_private_messages_always_trigger() -> None:
    assert trigger_reason(message(chat_type="private"), bot()) == "private"


def test_group_message_without_trigger_does_not() -> None:
    assert trigger_reason(message("just talking"), bot()) is None


def test_group_mention_of_the_bot_triggers() -> None:
    assert trigger_reason(message(mentions=["bot"]), bot()) == "mention"
    assert trigger_reason(message(mentions_bot=True), bot()) == "mention"
    assert trigger_reason(message(mentions=["someone-else"]), bot()) is None


def test_reply_to_the_bot_triggers_unless_disabled() -> None:
    replying = message(reply_to=ReplyRef(message_id="x", is_bot=True))
    assert trigger_reason(replying, bot()) == "reply_to_bot"
    assert trigger_reason(replying, bot(trigger=TriggerPolicy(reply_to_bot=False))) is None


def test_command_prefix_and_keywords_trigger() -> None:
    assert trigger_reason(message("/ask what time is it"), bot()) == "command"
    keyworded = bot(trigger=TriggerPolicy(command_prefix=None, keywords=["Robot"]))
    assert trigger_reason(message("hey robot, help"), keyworded) == "keyword"
    assert trigger_reason(message("/ask x"), keyworded) is None


@pytest.mark.parametrize(
    ("text", "name", "argument"),
    [
        ("/stop", "stop", ""),
        ("  /STOP  ", "stop", ""),
        ("/stop@my_bot", "stop", ""),
        ("/reset", "reset", ""),
        ("/allow", "allow", ""),
        ("/allow sevt-123", "allow", "sevt-123"),
        ("/deny not now please", "deny", "not now please"),
    ],
)
def test_chat_commands_are_parsed(text: str, name: str, argument: str) -> None:
    command = parse_chat_command(text)
    assert command is not None and (command.name, command.argument) == (name, argument)


@pytest.mark.parametrize("text", ["stop", "/stopping", "please /stop", "/ask stop", ""])
def test_non_commands_are_not_parsed(text: str) -> None:
    assert parse_chat_command(text) is None


def test_content_blocks_strip_the_bot_mention_and_the_command_prefix() -> None:
    msg = message(
        "@bot /ask hello",
        segments=[
            MentionSegment(type="mention", data=MentionData(target="bot")),
            TextSegment(type="text", data=TextData(text="/ask hello")),
        ],
    )
    blocks = content_blocks(msg, bot(), label_sender=True)
    assert blocks == [{"type": "text", "text": "[Ann (u1)] hello"}]


def test_content_blocks_keep_mentions_of_other_users() -> None:
    msg = message(
        segments=[
            TextSegment(type="text", data=TextData(text="ask ")),
            MentionSegment(type="mention", data=MentionData(target="u9")),
        ],
    )
    assert content_blocks(msg, bot(), label_sender=False)[0]["text"] == "ask @u9"


def test_content_blocks_set_a_mention_apart_from_the_words_around_it() -> None:
    """A mention chip followed by text (the console, OneBot's `at`) must not glue: `@alicehey`."""

    def mention(target: str) -> MentionSegment:
        return MentionSegment(type="mention", data=MentionData(target=target))

    def text(value: str) -> TextSegment:
        return TextSegment(type="text", data=TextData(text=value))

    glued = message(segments=[mention("alice"), mention("bot"), text("hey, look at this")])
    assert content_blocks(glued, bot(), label_sender=False)[0]["text"] == "@alice hey, look at this"
    inline = message(segments=[text("ask"), mention("u9"), mention("u8"), text(", then me")])
    assert content_blocks(inline, bot(), label_sender=False)[0]["text"] == "ask @u9 @u8, then me"
    spaced = message(segments=[text("hi "), mention("u9"), text(" there")])
    assert content_blocks(spaced, bot(), label_sender=False)[0]["text"] == "hi @u9 there"


def test_who_may_answer_a_confirmation() -> None:
    starter = message(sender=Sender(user_id="u1"))
    stranger = message(sender=Sender(user_id="u2"))
    admin = message(sender=Sender(user_id="u3", is_admin=True))
    default = bot()
    assert may_answer(default, "u1", starter)
    assert not may_answer(default, "u1", stranger)
    assert may_answer(default, "u1", admin)
    assert not may_answer(bot(confirm_policy="admins"), "u1", starter)
    assert may_answer(bot(confirm_policy="anyone"), "u1", stranger)
    assert may_answer(default, "u1", message(chat_type="private", sender=Sender(user_id="u2")))
