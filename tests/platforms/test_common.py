"""`build_inbound`: the inbound record from plain data, validated once."""

from __future__ import annotations

import pytest

from pipeline.platforms import WebhookRejected
from pipeline.platforms._common import (
    InboundParts,
    build_inbound,
    face_segment,
    media_segment,
    mention_segment,
    reply_segment,
    text_segment,
)
from pipeline.records import MAX_ID_CHARS, InboundMessage, ReplyRef, Sender
from pipeline.segments.models import (
    FaceData,
    FaceSegment,
    ImageSegment,
    Media,
    MediaData,
    MentionData,
    MentionSegment,
    ReplyData,
    ReplySegment,
    TextData,
    TextSegment,
)
from pipeline.settings import BotConfig

BOT = BotConfig(platform="slack", bot_id="sl1", self_id="UBOT")


def inbound(**extra: object) -> InboundMessage:
    fields: dict[str, object] = {
        "chat_id": "C1",
        "chat_type": "group",
        "user_id": "U1",
        "message_id": "1.0",
        "text": "hi",
        "segments": [text_segment("hi")],
        "mentions": [],
        "mentions_bot": False,
    } | extra
    return build_inbound("slack", BOT, **fields)  # type: ignore[arg-type]


def test_plain_segments_become_the_models_they_describe() -> None:
    message = inbound(
        user_name="Alice",
        is_admin=True,
        segments=[
            reply_segment("0.9"),
            mention_segment("UBOT"),
            text_segment(" look"),
            media_segment("image", "file", "F1"),
            face_segment(14),
        ],
        mentions=["UBOT", "U2"],
        mention_names={"UBOT": "bot", "U2": "", "U3": "not mentioned"},
        mentions_bot=True,
        reply_to=ReplyRef(message_id="0.9", user_id="U2"),
        event_id="Ev1",
        route={"thread_ts": "0.9"},
    )
    assert message.sender == Sender(user_id="U1", name="Alice", is_admin=True)
    assert message.segments == [
        ReplySegment(type="reply", data=ReplyData(message_id="0.9")),
        MentionSegment(type="mention", data=MentionData(target="UBOT")),
        TextSegment(type="text", data=TextData(text=" look")),
        ImageSegment(type="image", data=MediaData(media=Media(kind="file", value="F1"))),
        FaceSegment(type="face", data=FaceData(id=14)),
    ]
    assert message.reply_to == ReplyRef(message_id="0.9", user_id="U2")
    # Names only of mentioned ids, and only the ones the platform gave.
    assert message.mention_names == {"UBOT": "bot"}
    assert message.conversation_key == "slack:sl1:C1" and message.event_id == "Ev1"
    assert message.route == {"thread_ts": "0.9"} and message.hops.keys() == {"ingress"}


def test_per_user_sessions_key_the_group_by_sender() -> None:
    per_user = BotConfig(platform="slack", bot_id="sl1", session_scope="user")
    message = build_inbound(
        "slack",
        per_user,
        chat_id="C1",
        chat_type="group",
        user_id="U1",
        message_id="1.0",
        text="hi",
        segments=[text_segment("hi")],
        mentions=[],
        mentions_bot=False,
    )
    assert message.conversation_key == "slack:sl1:C1:U1"


def test_the_first_over_long_id_is_named() -> None:
    long_id = "x" * (MAX_ID_CHARS + 1)
    for field in ("chat_id", "user_id", "message_id", "event_id"):
        with pytest.raises(WebhookRejected) as caught:
            inbound(**{field: long_id})
        assert (caught.value.status, caught.value.reason) == (400, "id_too_long")
        assert caught.value.detail.startswith(f"{field} is {MAX_ID_CHARS + 1} characters long")
    with pytest.raises(WebhookRejected) as caught:
        inbound(user_id=long_id, event_id=long_id)
    assert caught.value.detail.startswith("user_id is")
    inbound(chat_id="x" * MAX_ID_CHARS)  # at the bound: taken


def test_a_segment_of_the_wrong_shape_is_still_refused() -> None:
    # Validated with the record: a value of the wrong type is a ValueError (payload_guard: a 400).
    with pytest.raises(ValueError):
        inbound(segments=[text_segment(5)])  # type: ignore[arg-type]


def test_inbound_parts_merge_adjacent_text() -> None:
    parts = InboundParts()
    parts.text("a")
    parts.text("")
    parts.text("b")
    parts.add_mention("U2", "Bob")
    parts.text("c")
    parts.add_media("file", "url", "https://x.test/r.pdf")
    assert parts.segments == [
        text_segment("ab"),
        mention_segment("U2"),
        text_segment("c"),
        media_segment("file", "url", "https://x.test/r.pdf"),
    ]
    assert parts.plain == ["a", "b", "@Bob", "c", "[file]"] and parts.names == {"U2": "Bob"}
