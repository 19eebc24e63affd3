"""Telegram: inbound Updates built with python-telegram-bot's own types; outbound against a local
stand-in of the Bot API that checks every request as Telegram would."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from telegram import Chat, Message, MessageEntity, PhotoSize, Update, User

from pipeline.addressing import trigger_reason
from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.telegram import TelegramPlatform
from pipeline.records import OutboundMessage
from pipeline.runtime import reply_context
from pipeline.segments import segment_list_adapter
from pipeline.segments.context import Member
from pipeline.segments.models import Media
from pipeline.settings import BotConfig
from pipeline.stages.ingest import content_blocks

from .conftest import PNG, PNG_B64, FakeApi, Seen, broken_loader, load_media, rejected_count

TOKEN = "123456:ABC-test"
BOT = User(id=777, first_name="Switch", is_bot=True, username="switch_bot")
ALICE = User(id=1001, first_name="Alice", last_name="Liddell", is_bot=False, username="alice")
GROUP = Chat(id=-1001234567890, type=Chat.SUPERGROUP, title="Wonderland")
PRIVATE = Chat(id=1001, type=Chat.PRIVATE, first_name="Alice")
WHEN = dt.datetime(2026, 11, 30, 5, 0, tzinfo=dt.UTC)


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="telegram",
        bot_id="tg1",
        self_id="777",
        username="switch_bot",
        credentials={"token": TOKEN, "webhook_secret": "s3cret-token"},
        api_base=api.url if api else None,
        **extra,
    )


def request(update: Update, secret: str | None = "s3cret-token") -> WebhookRequest:
    headers = {"content-type": "application/json"}
    if secret is not None:
        headers["x-telegram-bot-api-secret-token"] = secret
    return WebhookRequest(headers=headers, body=update.to_json().encode())


def group_text(update_id: int, text: str, *entities: MessageEntity) -> Update:
    """Alice's text message in the group, with its entities."""
    message = Message(update_id, WHEN, GROUP, from_user=ALICE, text=text, entities=entities)
    return Update(update_id, message=message)


def parse(update: Update, **bot_extra: Any) -> Any:  # Any: the tests read the fields of the segment types they expect
    platform = get_platform("telegram")
    bot = bot_config(**bot_extra)
    req = request(update)
    platform.verify(bot, req)
    return platform.parse(bot, req)


# --- in ------------------------------------------------------------------------------------------


def test_group_mention_by_username_with_utf16_offsets() -> None:
    # The emoji is two UTF-16 units: the entity offsets below are Telegram's, not Python's.
    text = "👋 @switch_bot what is 2+2?"
    msg = Message(
        42,
        WHEN,
        GROUP,
        from_user=ALICE,
        text=text,
        entities=(MessageEntity(MessageEntity.MENTION, offset=3, length=11),),
    )
    result = parse(Update(9001, message=msg))
    [m] = result.messages
    assert m.chat_id == "-1001234567890" and m.chat_type == "group"
    assert m.message_id == "42" and m.event_id == "9001"
    assert m.sender.user_id == "1001" and m.sender.name == "Alice Liddell"
    assert m.mentions_bot is True and m.mentions == ["777"]
    assert [s.type for s in m.segments] == ["text", "mention", "text"]
    assert m.segments[0].data.text == "👋 " and m.segments[2].data.text == " what is 2+2?"
    assert m.text == text
    assert m.conversation_key == "telegram:tg1:-1001234567890"
    assert m.sent_at_ms == WHEN.timestamp() * 1000
    assert "ingress" in m.hops and len(m.trace_id) == 32


def test_text_mention_of_bot_and_other_user_and_per_user_scope() -> None:
    msg = Message(
        43,
        WHEN,
        GROUP,
        from_user=ALICE,
        text="Switch ping Bob",
        entities=(
            MessageEntity(MessageEntity.TEXT_MENTION, 0, 6, user=BOT),
            MessageEntity(MessageEntity.TEXT_MENTION, 12, 3, user=User(2002, "Bob", False)),
        ),
    )
    [m] = parse(Update(9002, message=msg), session_scope="user").messages
    assert m.mentions == ["777", "2002"] and m.mentions_bot
    assert m.conversation_key == "telegram:tg1:-1001234567890:1001"


def test_mention_of_another_bot_does_not_trigger() -> None:
    msg = Message(
        44, WHEN, GROUP, from_user=ALICE, text="@other_bot hi", entities=(MessageEntity(MessageEntity.MENTION, 0, 10),)
    )
    [m] = parse(Update(9003, message=msg)).messages
    assert not m.mentions_bot and m.mentions == ["@other_bot"]


def test_reply_to_bot_and_bot_command() -> None:
    parent = Message(40, WHEN, GROUP, from_user=BOT, text="earlier answer")
    msg = Message(45, WHEN, GROUP, from_user=ALICE, text="and then?", reply_to_message=parent)
    [m] = parse(Update(9004, message=msg)).messages
    assert m.reply_to is not None and m.reply_to.is_bot and m.reply_to.message_id == "40"
    assert m.reply_to.text == "earlier answer" and m.segments[0].type == "reply"
    assert not m.mentions_bot  # ingest decides the reply trigger

    [c] = parse(group_text(9005, "/ask@switch_bot hello", MessageEntity(MessageEntity.BOT_COMMAND, 0, 15))).messages
    assert c.mentions_bot
    [o] = parse(group_text(9006, "/ask@other_bot hello", MessageEntity(MessageEntity.BOT_COMMAND, 0, 14))).messages
    assert not o.mentions_bot


def test_a_command_addressed_to_this_bot_loses_the_suffix() -> None:
    command = MessageEntity(MessageEntity.BOT_COMMAND, 0, 18)
    [m] = parse(group_text(9020, "/status@switch_bot deploy-42", command)).messages
    assert m.text == "/status deploy-42" and m.mentions_bot
    assert [s.data.text for s in m.segments] == ["/status deploy-42"]
    # The command-prefix trigger still sees the command, and the agent gets the question.
    prefixed = bot_config(trigger={"mention": False, "command_prefix": "/status"})
    assert trigger_reason(m, prefixed) == "command"
    assert content_blocks(m, prefixed, label_sender=False)[0]["text"] == "deploy-42"
    # Case-insensitive, and the rest of the text sliced in UTF-16 units.
    ask = MessageEntity(MessageEntity.BOT_COMMAND, 0, 15)
    [a] = parse(group_text(9021, "/ask@Switch_Bot 👋 what now?", ask)).messages
    assert a.text == "/ask 👋 what now?"
    assert content_blocks(a, bot_config(), label_sender=False)[0]["text"] == "👋 what now?"
    # Addressed to another bot: left as it is, and not a trigger.
    other = MessageEntity(MessageEntity.BOT_COMMAND, 0, 14)
    [o] = parse(group_text(9022, "/ask@other_bot x", other)).messages
    assert o.text == "/ask@other_bot x" and not o.mentions_bot


def test_mentions_of_other_users_reach_the_agent_with_their_names() -> None:
    bob = User(2002, "Bob", False, last_name="Builder")  # no username: Telegram sends a text_mention
    update = group_text(
        9023,
        "@switch_bot ask Bob and @carol_c",
        MessageEntity(MessageEntity.MENTION, 0, 11),
        MessageEntity(MessageEntity.TEXT_MENTION, 16, 3, user=bob),
        MessageEntity(MessageEntity.MENTION, 24, 8),
    )
    [m] = parse(update).messages
    assert m.mentions == ["777", "2002", "@carol_c"] and m.mention_names == {"2002": "Bob Builder"}
    bot = bot_config()
    # Not `@@carol_c`; an @username is written as is, and Telegram links it when the agent writes it back.
    assert content_blocks(m, bot, label_sender=False)[0]["text"] == "ask @Bob Builder and @carol_c"
    ctx = reply_context(bot, m, [])
    assert ctx.context_members == (Member("2002", "Bob Builder"), Member("@carol_c", ""))
    assert {"2002", "@carol_c"} <= ctx.mentionable_ids()


def test_private_photo_with_caption_and_forum_topic() -> None:
    photos = (PhotoSize("small-id", "u1", 90, 90), PhotoSize("big-id", "u2", 1280, 1280))
    msg = Message(48, WHEN, PRIVATE, from_user=ALICE, photo=photos, caption="look")
    [m] = parse(Update(9007, message=msg)).messages
    assert m.chat_type == "private" and m.chat_id == "1001"
    assert [s.type for s in m.segments] == ["text", "image"]
    assert m.segments[1].data.media.kind == "file" and m.segments[1].data.media.value == "big-id"
    assert m.text == "look [image]"

    topic_root = Message(10, WHEN, GROUP, from_user=ALICE, text="topic")
    in_topic = Message(
        49,
        WHEN,
        GROUP,
        from_user=ALICE,
        text="hi",
        message_thread_id=10,
        is_topic_message=True,
        reply_to_message=topic_root,
    )
    [t] = parse(Update(9008, message=in_topic)).messages
    assert t.route == {"message_thread_id": "10"} and t.reply_to is None


def test_ignored_updates_and_own_messages() -> None:
    edited = Update(9010, edited_message=Message(50, WHEN, GROUP, from_user=ALICE, text="x"))
    assert parse(edited).ignored == "not_message"
    channel = Update(9011, message=Message(51, WHEN, Chat(-100999, Chat.CHANNEL), text="news"))
    assert parse(channel).ignored == "unsupported_chat"
    own = Update(9012, message=Message(52, WHEN, GROUP, from_user=BOT, text="me"))
    assert parse(own).ignored == "own_message"


def test_secret_token_and_malformed() -> None:
    platform = get_platform("telegram")
    update = Update(9013, message=Message(53, WHEN, PRIVATE, from_user=ALICE, text="hi"))
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot_config(), request(update, secret="wrong"))
    assert exc.value.status == 401 and exc.value.reason == "bad_signature"
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot_config(), request(update, secret=None))
    assert exc.value.status == 401
    for body in (b"{not json", b"[]", b'{"message": {}}', b'{"update_id": 1, "message": {"chat": {}}}'):
        with pytest.raises(WebhookRejected) as exc:
            platform.parse(bot_config(), WebhookRequest(headers={}, body=body))
        assert exc.value.status == 400


# --- out -----------------------------------------------------------------------------------------


def outbound(segments: list[dict[str, Any]], **extra: Any) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-1",
        kind="reply",
        platform="telegram",
        bot_id="tg1",
        chat_id=str(GROUP.id),
        chat_type="group",
        conversation_key="telegram:tg1:-1001234567890",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


def utf16_units(text: str) -> int:
    """Telegram measures text and entity offsets in UTF-16 code units (Bot API, MessageEntity:
    "Offset in UTF-16 code units"). Counted here from the encoding itself, not with the
    implementation's helper, so a bug in that helper cannot pass its own check."""
    return len(text.encode("utf-16-le")) // 2


# Bot API, sendMessage: "text: Text of the message to be sent, 1-4096 characters after entities
# parsing"; sendPhoto and the other media methods: "caption: … 0-1024 characters after entities
# parsing". The stand-in refuses what Telegram refuses, with Telegram's numbers written here.
TELEGRAM_TEXT_LIMIT = 4096
TELEGRAM_CAPTION_LIMIT = 1024


def check_telegram_request(seen: Seen) -> tuple[int, dict[str, Any]]:
    """What the Bot API would refuse: a wrong token, no chat, text over the limits, entities
    outside the text (checked with PTB's own UTF-16 entity parsing)."""
    assert seen.method == "POST"
    assert seen.path.startswith(f"/bot{TOKEN}/"), seen.path
    body = seen.json if seen.json is not None else {k: _maybe_json(v) for k, v in seen.form.items()}
    assert "chat_id" in body
    for field in ("photo", "audio", "video", "document"):
        if isinstance(body.get(field), str):  # a file_id, or a URL for Telegram's servers to fetch
            value = body[field]
            assert re.fullmatch(r"[\w-]+", value) or value.startswith(("https://", "http://")), value
    for text_key, ent_key, limit in (
        ("text", "entities", TELEGRAM_TEXT_LIMIT),
        ("caption", "caption_entities", TELEGRAM_CAPTION_LIMIT),
    ):
        if text_key in body:
            text = body[text_key]
            assert 0 < utf16_units(text) <= limit, utf16_units(text)
            assert text == text.strip()
            entities = [MessageEntity.de_json(e, None) for e in body.get(ent_key, [])]
            parsed = Message(1, WHEN, GROUP, text=text, entities=tuple(entities)).parse_entities()
            for entity in entities:
                assert entity.offset + entity.length <= utf16_units(text)
                assert parsed[entity]  # the entity covers real text
    return 200, {"ok": True, "result": {"message_id": next(_ids)}}


_ids = itertools.count(500)


def _maybe_json(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


async def test_markdown_becomes_entities(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(f"/bot{TOKEN}/sendMessage", check_telegram_request)
    platform = get_platform("telegram")
    bot = bot_config(api)
    message = outbound(
        [
            {"type": "mention", "data": {"target": "1001"}},
            {"type": "text", "data": {"text": " 你好 😀 "}},
            {
                "type": "markdown",
                "data": {
                    "content": "**bold** and _it_ `x=1` [docs](https://example.com/d)\n\n```python\nprint('hi')\n```"
                },
            },
            {"type": "share", "data": {"url": "https://example.com/s", "title": "Shared"}},
        ],
        reply_to_message_id="42",
    )
    [call] = platform.render(bot, message)
    outcome = await platform.send(bot, call, http, load_media)
    assert outcome.status == "delivered" and outcome.platform_message_id
    [seen] = api.calls(f"/bot{TOKEN}/sendMessage")
    body = seen.json
    assert "parse_mode" not in body
    assert body["reply_parameters"] == {"message_id": 42, "allow_sending_without_reply": True}
    entities = [MessageEntity.de_json(e, None) for e in body["entities"]]
    parsed = Message(1, WHEN, GROUP, text=body["text"], entities=tuple(entities)).parse_entities()
    by_type = {e.type: (text, e) for e, text in parsed.items()}
    mentioned = by_type["text_mention"][1].user
    assert by_type["text_mention"][0] == "@1001" and mentioned is not None and mentioned.id == 1001
    assert by_type["bold"][0] == "bold"
    assert by_type["italic"][0] == "it"
    assert by_type["code"][0] == "x=1"
    assert by_type["pre"][0] == "print('hi')" and by_type["pre"][1].language == "python"
    links = {text: e.url for e, text in parsed.items() if e.type == "text_link"}
    assert links == {"docs": "https://example.com/d", "Shared": "https://example.com/s"}


async def test_long_text_split_at_4096_utf16_units(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(f"/bot{TOKEN}/sendMessage", check_telegram_request)
    platform = get_platform("telegram")
    bot = bot_config(api)
    # 3,000 emoji are 6,000 UTF-16 units but only 3,000 code points: a code-point limit would pass.
    content = "**" + "😀" * 3000 + "**\n\n" + "word " * 600
    message = outbound([{"type": "markdown", "data": {"content": content}}], reply_to_message_id="42")
    calls = platform.render(bot, message)
    assert len(calls) >= 2
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    sent = api.calls(f"/bot{TOKEN}/sendMessage")
    assert len(sent) == len(calls)
    assert "reply_parameters" in sent[0].json and all("reply_parameters" not in s.json for s in sent[1:])
    joined = "".join(s.json["text"] for s in sent)
    assert joined.count("😀") == 3000
    assert sent[0].json["entities"][0]["type"] == "bold"


async def test_media_url_upload_caption_dice_and_fallbacks(
    api: FakeApi, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    for method in ("sendPhoto", "sendDocument", "sendDice", "sendMessage", "sendVideo"):
        api.on(f"/bot{TOKEN}/{method}", check_telegram_request)
    platform = get_platform("telegram")
    bot = bot_config(api)
    path = tmp_path / "report.bin"
    path.write_bytes(b"\x00binary-report")
    message = outbound(
        [
            {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/cat.png"}}},
            {"type": "text", "data": {"text": "a cat"}},
            {
                "type": "image",
                "data": {
                    "media": {
                        "kind": "base64",
                        "value": PNG_B64,
                    }
                },
            },
            {"type": "file", "data": {"media": {"kind": "path", "value": str(path)}}},
            {"type": "video", "data": {"media": {"kind": "file", "value": "BAACAgQAAx0"}}},
            {"type": "dice", "data": {}},
            {"type": "rps", "data": {}},
            {"type": "face", "data": {"id": 14}},
            {"type": "forward", "data": {"forward_id": "fw1"}},
        ]
    )
    calls = platform.render(bot, message)
    assert [c.path for c in calls] == [
        "/sendPhoto",
        "/sendPhoto",
        "/sendDocument",
        "/sendVideo",
        "/sendDice",
        "/sendMessage",
    ]
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    url_photo, upload_photo = api.calls(f"/bot{TOKEN}/sendPhoto")
    assert url_photo.json["photo"] == "https://example.com/cat.png" and url_photo.json["caption"] == "a cat"
    assert upload_photo.files["photo"][1] == PNG and upload_photo.form["chat_id"] == str(GROUP.id)
    [doc] = api.calls(f"/bot{TOKEN}/sendDocument")
    assert doc.files["document"][0] == "report.bin" and doc.files["document"][1] == b"\x00binary-report"
    assert api.calls(f"/bot{TOKEN}/sendVideo")[0].json["video"] == "BAACAgQAAx0"
    assert api.calls(f"/bot{TOKEN}/sendDice")[0].json["emoji"] == "🎲"
    tail = api.calls(f"/bot{TOKEN}/sendMessage")[0].json["text"]
    assert tail[0] in "✊✌✋" and "🙂" in tail and "转发" in tail  # rps, QQ face 14, forward notice


async def test_unreadable_media_becomes_notice(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(f"/bot{TOKEN}/sendMessage", check_telegram_request)
    platform = get_platform("telegram")
    bot = bot_config(api, language="en")
    [call] = platform.render(
        bot, outbound([{"type": "image", "data": {"media": {"kind": "path", "value": "/nope.png"}}}])
    )
    assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    assert api.calls(f"/bot{TOKEN}/sendMessage")[0].json["text"] == "[attachment unavailable]"


@pytest.mark.parametrize(
    ("status", "body", "verdict", "reason", "retry_after"),
    [
        (
            429,
            {
                "ok": False,
                "error_code": 429,
                "description": "Too Many Requests: retry after 7",
                "parameters": {"retry_after": 7},
            },
            "retry",
            "rate_limited",
            7.0,
        ),
        (
            403,
            {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked by the user"},
            "permanent",
            "blocked",
            None,
        ),
        (
            400,
            {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"},
            "permanent",
            "chat_not_found",
            None,
        ),
        (
            400,
            {
                "ok": False,
                "error_code": 400,
                "description": "Bad Request: group chat was upgraded to a supergroup chat",
                "parameters": {"migrate_to_chat_id": -1009},
            },
            "permanent",
            "chat_migrated",
            None,
        ),
        (502, "Bad Gateway", "retry", "server_error", None),
        (500, {"ok": False, "error_code": 500, "description": "Internal Server Error"}, "retry", "server_error", None),
    ],
)
async def test_error_classification(
    api: FakeApi,
    http: httpx.AsyncClient,
    status: int,
    body: Any,
    verdict: str,
    reason: str,
    retry_after: float | None,
) -> None:
    api.reply(f"/bot{TOKEN}/sendMessage", status, body)
    platform = get_platform("telegram")
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == (verdict, reason, retry_after)
    if verdict == "permanent":
        assert outcome.detail.startswith(body["description"])


async def test_network_error_is_retry_and_typing(api: FakeApi, http: httpx.AsyncClient) -> None:
    platform = TelegramPlatform()
    dead = BotConfig(platform="telegram", bot_id="tg1", credentials={"token": TOKEN}, api_base="http://127.0.0.1:9")
    [call] = platform.render(dead, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(dead, call, http, load_media)
    assert outcome.status == "retry" and outcome.reason == "network"

    api.reply(f"/bot{TOKEN}/sendChatAction", 200, {"ok": True, "result": True})
    await platform.typing(bot_config(api), "-1001234567890", http)
    [seen] = api.calls(f"/bot{TOKEN}/sendChatAction")
    assert seen.json == {"chat_id": -1001234567890, "action": "typing"}
    await platform.typing(dead, "1", http)  # best effort: no exception


def test_profile() -> None:
    profile = TelegramPlatform.profile
    assert profile.max_text_chars == 4096 and profile.max_caption_chars == 1024
    assert profile.default_chat_limit is not None and profile.default_bot_limit is not None


async def test_url_telegram_cannot_fetch_is_uploaded(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.reply(
        f"/bot{TOKEN}/sendPhoto",
        400,
        {"ok": False, "error_code": 400, "description": "Bad Request: failed to get HTTP URL content"},
        once=True,
    )
    api.on(f"/bot{TOKEN}/sendPhoto", check_telegram_request)
    fetched: list[str] = []

    async def loader(media: Media) -> tuple[bytes, str]:
        fetched.append(media.value)
        return PNG, "image/png"

    platform = get_platform("telegram")
    bot = bot_config(api)
    image = {"type": "image", "data": {"media": {"kind": "url", "value": "https://intranet.example/cat.png"}}}
    [call] = platform.render(bot, outbound([image, {"type": "text", "data": {"text": "cap"}}]))
    outcome = await platform.send(bot, call, http, loader)
    assert outcome.status == "delivered" and fetched == ["https://intranet.example/cat.png"]
    by_url, uploaded = api.calls(f"/bot{TOKEN}/sendPhoto")
    assert by_url.json["photo"] == "https://intranet.example/cat.png"
    assert uploaded.files["photo"] == ("cat.png", PNG, "image/png") and uploaded.form["caption"] == "cap"


@pytest.mark.parametrize("value", ["attach://photo", "file:///etc/shadow", "/tmp/x.png", "../x", "short"])
async def test_a_reference_not_shaped_like_a_file_id_is_not_sent(
    api: FakeApi, http: httpx.AsyncClient, value: str
) -> None:
    api.on(f"/bot{TOKEN}/sendMessage", check_telegram_request)
    platform = get_platform("telegram")
    bot = bot_config(api, language="en")
    before = rejected_count("telegram", "file_id_shape")
    message = outbound([{"type": "image", "data": {"media": {"kind": "file", "value": value}}}, _text("below")])
    for call in platform.render(bot, message):
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    [sent] = api.calls(f"/bot{TOKEN}/sendMessage")
    assert sent.json["text"] == "[attachment unavailable] below"
    assert rejected_count("telegram", "file_id_shape") == before + 1


async def test_an_unreadable_photo_keeps_its_caption(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(f"/bot{TOKEN}/sendMessage", check_telegram_request)
    platform = get_platform("telegram")
    bot = bot_config(api, language="en")
    before = rejected_count("telegram", "unreadable")
    message = outbound(
        [
            {"type": "image", "data": {"media": {"kind": "path", "value": "/nope.png"}}},
            {"type": "markdown", "data": {"content": "**the** caption"}},
        ]
    )
    [call] = platform.render(bot, message)
    assert call.json is not None and call.json["caption"] == "the caption"
    assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    [sent] = api.calls(f"/bot{TOKEN}/sendMessage")
    assert sent.json["text"] == "[attachment unavailable]\nthe caption"
    assert sent.json["entities"] == [{"type": "bold", "offset": 25, "length": 3}]
    assert rejected_count("telegram", "unreadable") == before + 1


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": text}}
