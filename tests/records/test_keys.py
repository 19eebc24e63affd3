"""Keys made of ids: no two lists of ids give the same key, and every key reads back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.records import ConversationRef, conversation_key, join_ids, parse_conversation_key, split_ids

ids = st.text(alphabet=st.sampled_from("ab:%3A25"), max_size=6)


def test_ids_with_a_colon_no_longer_share_a_conversation() -> None:
    # Before: both were "slack:sl1:a:b:c".
    chat_with_colon = conversation_key("slack", "sl1", "a:b", "c")
    user_with_colon = conversation_key("slack", "sl1", "a", "b:c")
    assert chat_with_colon != user_with_colon
    assert chat_with_colon == "slack:sl1:a%3Ab:c" and user_with_colon == "slack:sl1:a:b%3Ac"
    assert parse_conversation_key(chat_with_colon) == ConversationRef("slack", "sl1", "a:b", "c")
    assert parse_conversation_key(user_with_colon) == ConversationRef("slack", "sl1", "a", "b:c")


def test_ordinary_ids_read_as_before() -> None:
    assert conversation_key("telegram", "tg1", "-1001234567890") == "telegram:tg1:-1001234567890"
    assert conversation_key("lark", "lk1", "oc_5ce6", "ou_alice") == "lark:lk1:oc_5ce6:ou_alice"


def test_percent_signs_are_encoded_too() -> None:
    # Without `%` → `%25`, the chat id "a%3Ab" would read back as "a:b".
    key = conversation_key("console", "demo", "a%3Ab")
    assert key != conversation_key("console", "demo", "a:b")
    assert parse_conversation_key(key).chat_id == "a%3Ab"


@given(st.lists(ids, min_size=1, max_size=5), st.lists(ids, min_size=1, max_size=5))
def test_joining_is_injective_and_reversible(left: list[str], right: list[str]) -> None:
    assert split_ids(join_ids(*left)) == left
    assert (join_ids(*left) == join_ids(*right)) == (left == right)


@given(ids, ids, ids, st.none() | ids)
def test_conversation_keys_read_back(platform: str, bot: str, chat: str, user: str | None) -> None:
    ref = parse_conversation_key(conversation_key(platform, bot, chat, user))
    assert ref == ConversationRef(platform, bot, chat, user)


@pytest.mark.parametrize("key", ["", "console", "console:demo", "a:b:c:d:e"])
def test_what_is_not_a_conversation_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="not a conversation key"):
        parse_conversation_key(key)
