"""Ids that stages hash or read back from keys: no id can pass for another."""

from __future__ import annotations

import hashlib

from pipeline.records import conversation_key
from pipeline.stages._ids import stable_id, user_message_id
from pipeline.stages.render import _chat_of


def test_stable_ids_keep_parts_apart() -> None:
    # A separator inside one part no longer shifts a boundary between parts.
    assert stable_id("out-", "a\x1fb", "c") != stable_id("out-", "a", "b\x1fc")
    assert stable_id("out-", "a%1Fb", "c") != stable_id("out-", "a\x1fb", "c")
    assert user_message_id("console:demo:g", ["m\x1f1"]) != user_message_id("console:demo:g", ["m", "1"])


def test_ordinary_parts_hash_as_they_did() -> None:
    # Ids made before this escaping (replayed records) must come out the same.
    before = hashlib.blake2b("\x1f".join(["telegram:tg1:-100", "42"]).encode(), digest_size=12).hexdigest()
    assert stable_id("sevt-sb-", "telegram:tg1:-100", "42") == f"sevt-sb-{before}"


def test_the_chat_is_read_back_from_an_encoded_conversation_key() -> None:
    # Without the turn's state (Redis lost), render takes the chat from the key itself.
    assert _chat_of(conversation_key("console", "demo", "a:b"), None) == ("a:b", "private")
    assert _chat_of(conversation_key("console", "demo", "a", "b:c"), None) == ("a", "group")
    assert _chat_of(conversation_key("console", "demo", "50%"), None) == ("50%", "private")
