"""Shared fixtures of the segments tests: one turn context and policy builders."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.segments import (
    Capabilities,
    LeakAction,
    LeakScanner,
    Member,
    MentionPolicy,
    RepliedMessage,
    ReplyPolicy,
    TurnContext,
)

CONFIGURED_SECRET = "corpus-configured-secret-0001"
SCANNER = LeakScanner([CONFIGURED_SECRET])

TURN = TurnContext(
    bot_id="bot-1",
    platform="onebot",
    chat_type="group",
    sender_id="10001",
    sender_name="Alice",
    chat_id="g-1",
    replied_to=RepliedMessage(message_id="m-1", author_id="10004", author_name="Dan", text="earlier"),
    context_members=(Member("10002", "Bob"), Member("10003", "Carol"), Member("90000", "the bot")),
    looked_up_member_ids=frozenset({"10005"}),
    bot_self_ids=frozenset({"90000"}),
)


def make_policy(**overrides: Any) -> ReplyPolicy:
    values: dict[str, Any] = {"leak_scanner": SCANNER}
    for key, value in overrides.items():
        if key == "mention_policy":
            value = MentionPolicy(value)
        elif key == "leak_action":
            value = LeakAction(value)
        values[key] = value
    return ReplyPolicy(**values)


@pytest.fixture
def turn() -> TurnContext:
    return TURN


@pytest.fixture
def capabilities() -> Capabilities:
    return Capabilities()
