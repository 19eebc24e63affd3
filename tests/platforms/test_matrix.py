"""Matrix: frames of mautrix-built events parsed (rooms and direct rooms, mentions by `m.mentions`
and pills, replies, media, what starts no turn), outbound messages rendered (reply relation, pills
with `m.mentions`, HTML, stable transaction ids) and sent to the stand-in homeserver
(`tests/connections/matrix_standin.py`), which checks every request as a homeserver does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.checks import bot_problems
from pipeline.platforms.matrix import MatrixPlatform, txn_id
from pipeline.records import OutboundMessage
from pipeline.segments import MediaChecker
from pipeline.settings import BotConfig
from tests.connections.matrix_standin import ACCESS_TOKEN, AS_TOKEN, BOT_USER, HS_TOKEN, SERVER, Homeserver

from .conftest import PNG_B64, MediaServer, broken_loader, load_media

ROOM = f"!room:{SERVER}"
ALICE = f"@alice:{SERVER}"
platform = MatrixPlatform()


def bot_config(homeserver: Homeserver | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="matrix",
        bot_id="mx1",
        self_id=BOT_USER,
        transport="sync",
        api_base=homeserver.url if homeserver else "http://127.0.0.1:9",
        credentials={"access_token": ACCESS_TOKEN},
        **extra,
    )


def frame(event: dict[str, Any], *, direct: bool = False, reply_sender: str | None = None) -> WebhookRequest:
    body = {"room_id": ROOM, "direct": direct, "event": event, "reply_sender": reply_sender}
    return WebhookRequest(headers={}, body=json.dumps(body).encode())


def outbound(segments: list[dict[str, Any]], **extra: Any) -> OutboundMessage:
    return OutboundMessage.model_validate(
        {
            "outbound_id": "out-abc:1",
            "kind": "reply",
            "platform": "matrix",
            "bot_id": "mx1",
            "chat_id": ROOM,
            "chat_type": "group",
            "conversation_key": f"matrix:mx1:{ROOM}",
            "segments": segments,
            **extra,
        }
    )


@pytest.fixture
async def homeserver() -> AsyncIterator[Homeserver]:
    server = Homeserver()
    server.add_room(ROOM, [ALICE, f"@bob:{SERVER}"])
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        assert server.errors == [], "requests a homeserver would refuse"


# --- in -------------------------------------------------------------------------------------------


def test_a_pill_and_m_mentions_address_the_bot_in_a_room() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "what time is it?", mention=True)
    [message] = platform.parse(bot_config(), frame(event)).messages
    assert (message.chat_id, message.chat_type, message.sender.user_id, message.message_id) == (
        ROOM,
        "group",
        ALICE,
        event["event_id"],
    )
    assert message.mentions_bot and message.mentions == [BOT_USER]
    assert [s.type for s in message.segments] == ["mention", "text"]
    assert message.text == "@switch: what time is it?"


def test_the_sender_is_named_by_the_display_name_the_holder_saw_else_the_localpart() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "hi")
    request = frame(event)
    named = json.loads(request.body) | {"sender_name": "Alice A."}
    [message] = platform.parse(bot_config(), WebhookRequest(headers={}, body=json.dumps(named).encode())).messages
    assert message.sender.name == "Alice A."
    [message] = platform.parse(bot_config(), request).messages
    assert message.sender.name == "alice"


def test_a_room_message_without_a_mention_does_not_address_the_bot() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "hello all")
    [message] = platform.parse(bot_config(), frame(event)).messages
    assert not message.mentions_bot and message.chat_type == "group"


def test_m_mentions_decides_even_when_the_body_names_the_bot() -> None:
    event = Homeserver().text_event(ROOM, ALICE, f"I told {BOT_USER} about it")
    assert event["content"]["m.mentions"] == {}
    [message] = platform.parse(bot_config(), frame(event)).messages
    assert not message.mentions_bot  # intentional mentions: the body alone is no mention
    del event["content"]["m.mentions"]  # a client from before intentional mentions
    [message] = platform.parse(bot_config(), frame(event)).messages
    assert message.mentions_bot
    event["content"]["body"] = "Switch Bot, are you there?"
    [message] = platform.parse(bot_config(username="switch bot"), frame(event)).messages
    assert message.mentions_bot  # the display name as a word
    [message] = platform.parse(bot_config(username="switch"), frame(event)).messages
    assert message.mentions_bot
    event["content"]["body"] = "switchboard is down"
    [message] = platform.parse(bot_config(username="switch"), frame(event)).messages
    assert not message.mentions_bot


def test_a_direct_room_is_a_private_chat() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "hi")
    [message] = platform.parse(bot_config(), frame(event, direct=True)).messages
    assert message.chat_type == "private"


def test_a_reply_to_the_bot_says_so_and_loses_the_fallback_quote() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "> <@switch:example.org> earlier\n\nand now?", reply_to="$bot1")
    [message] = platform.parse(bot_config(), frame(event, reply_sender=BOT_USER)).messages
    assert message.reply_to is not None and message.reply_to.is_bot and message.reply_to.message_id == "$bot1"
    assert message.text == "and now?"
    assert message.segments[0].type == "reply"
    [other] = platform.parse(bot_config(), frame(event, reply_sender=ALICE)).messages
    assert other.reply_to is not None and not other.reply_to.is_bot


def test_an_html_reply_fallback_is_left_out() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "x", reply_to="$p")
    event["content"].update(
        format="org.matrix.custom.html",
        formatted_body="<mx-reply><blockquote>old <b>text</b></blockquote></mx-reply>new <b>text</b>",
    )
    [message] = platform.parse(bot_config(), frame(event)).messages
    assert message.text == "new text"


def test_a_threaded_message_keeps_its_thread() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "in a thread")
    relation = {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$x"},
    }
    event["content"]["m.relates_to"] = relation
    [message] = platform.parse(bot_config(), frame(event)).messages
    assert message.route == {"thread_root": "$root"}
    assert message.reply_to is None  # the fallback points at the thread's latest event: no reply
    relation["is_falling_back"] = False  # a reply to one message of the thread
    [message] = platform.parse(bot_config(), frame(event, reply_sender=BOT_USER)).messages
    assert message.reply_to is not None and message.reply_to.message_id == "$x" and message.reply_to.is_bot


def test_media_arrive_as_their_mxc_uri() -> None:
    event = Homeserver().text_event(ROOM, ALICE, "cat.png")
    event["content"] = {"msgtype": "m.image", "body": "look", "filename": "cat.png", "url": f"mxc://{SERVER}/abc123"}
    [message] = platform.parse(bot_config(), frame(event)).messages
    image = message.segments[0]
    assert image.type == "image" and image.data.media.kind == "file"
    assert image.data.media.value == f"mxc://{SERVER}/abc123"
    assert message.text == "[image] look"


@pytest.mark.parametrize(
    ("change", "ignored"),
    [
        ({"sender": BOT_USER}, "own_message"),
        ({"content": {"msgtype": "m.notice", "body": "a bot's"}}, "notice"),
        ({"content": {"msgtype": "m.text", "body": "* x", "m.relates_to": {"rel_type": "m.replace"}}}, "edit"),
        ({"content": {}}, "unsupported_message"),  # redacted
        ({"type": "m.reaction"}, "not_message"),
    ],
)
def test_what_starts_no_turn(change: dict[str, Any], ignored: str) -> None:
    event = {**Homeserver().text_event(ROOM, ALICE, "x"), **change}
    result = platform.parse(bot_config(), frame(event))
    assert result.messages == [] and result.ignored == ignored


@pytest.mark.parametrize(
    "body",
    [b"[]", b'{"room_id": "!r:s"}', b'{"room_id": "nope", "event": {"event_id": "$e", "sender": "@a:s"}}'],
)
def test_a_malformed_frame_is_a_400(body: bytes) -> None:
    with pytest.raises(WebhookRejected) as rejected:
        platform.parse(bot_config(), WebhookRequest(headers={}, body=body))
    assert rejected.value.status == 400


def test_matrix_takes_no_webhooks() -> None:
    with pytest.raises(WebhookRejected):
        platform.verify(bot_config(), WebhookRequest(headers={}, body=b"{}"))


def test_the_bots_file_needs_the_user_id_and_the_homeserver() -> None:
    entry = {"platform": "matrix", "bot_id": "m", "transport": "sync", "credentials": {"access_token": "t"}}
    problems = {p.loc[1:]: p.message for p in bot_problems([entry])}
    assert set(problems) == {("self_id",), ("api_base",)}
    assert bot_problems([{**entry, "self_id": BOT_USER, "api_base": "https://matrix.example.org"}]) == []
    webhook = {**entry, "self_id": BOT_USER, "api_base": "https://m.example.org", "transport": "webhook"}
    assert "does not offer transport 'webhook'" in bot_problems([webhook])[0].message


# --- out ------------------------------------------------------------------------------------------


def test_a_reply_with_a_mention_and_markdown() -> None:
    message = outbound(
        [
            {"type": "mention", "data": {"target": ALICE}},
            {"type": "markdown", "data": {"content": " **done** & <b>not html</b>; @room"}},
        ],
        reply_to_message_id="$q",
    )
    [call] = platform.render(bot_config(), message)
    assert call.method == "PUT"
    assert call.path == f"/_matrix/client/v3/rooms/%21room%3A{SERVER}/send/m.room.message/sb.out-abc_1.0"
    assert call.json == {
        "msgtype": "m.text",
        "body": "alice done & <b>not html</b>; @room",
        "format": "org.matrix.custom.html",
        "formatted_body": f'<a href="https://matrix.to/#/{ALICE}">alice</a> <strong>done</strong> '
        "&amp; &lt;b&gt;not html&lt;/b&gt;; @room",
        "m.mentions": {"user_ids": [ALICE]},
        "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}},
    }


def test_transaction_ids_are_stable_and_distinct() -> None:
    message = outbound([{"type": "text", "data": {"text": "x" * 9000}}])
    first = [c.path for c in platform.render(bot_config(), message)]
    assert first == [c.path for c in platform.render(bot_config(), message)]
    assert len(first) == len(set(first)) == 3
    assert len(txn_id("o" * 1000, 0)) < 255 and txn_id("o" * 1000, 0) != txn_id("o" * 999 + "p", 0)


def test_in_a_thread_the_reply_stays_in_it() -> None:
    message = outbound([{"type": "text", "data": {"text": "a"}}], reply_to_message_id="$q", route={"thread_root": "$r"})
    [call] = platform.render(bot_config(), message)
    assert call.json is not None
    assert call.json["m.relates_to"] == {"rel_type": "m.thread", "event_id": "$r", "m.in_reply_to": {"event_id": "$q"}}


async def test_sent_once_per_transaction_even_when_retried(homeserver: Homeserver, http: httpx.AsyncClient) -> None:
    bot = bot_config(homeserver)
    homeserver.events["$q"] = {"event_id": "$q"}
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hello"}}], reply_to_message_id="$q"))
    first = await platform.send(bot, call, http, load_media)
    again = await platform.send(bot, call, http, load_media)
    assert first.status == again.status == "delivered"
    assert first.platform_message_id == again.platform_message_id
    assert len(homeserver.stored) == 1 and homeserver.send_attempts[call.path.rsplit("/", 1)[1]] == 2


async def test_media_are_uploaded_then_sent(homeserver: Homeserver, http: httpx.AsyncClient) -> None:
    bot = bot_config(homeserver)
    image = {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}}
    text, media = platform.render(bot, outbound([{"type": "text", "data": {"text": "look:"}}, image]))
    assert (await platform.send(bot, text, http, load_media)).status == "delivered"
    assert (await platform.send(bot, media, http, load_media)).status == "delivered"
    sent = homeserver.stored[-1].content
    assert sent["msgtype"] == "m.image" and sent["url"] in homeserver.uploads
    assert sent["info"]["mimetype"] == "image/png" and sent["info"]["size"] == len(homeserver.uploads[sent["url"]])


async def test_a_url_is_fetched_through_the_guarded_loader(
    homeserver: Homeserver, http: httpx.AsyncClient, media_server: MediaServer, guarded_loader: MediaChecker
) -> None:
    bot = bot_config(homeserver)
    segment = {"type": "file", "data": {"media": {"kind": "url", "value": f"{media_server.url}/r.pdf"}}}
    [call] = platform.render(bot, outbound([segment]))
    assert (await platform.send(bot, call, http, guarded_loader.load)).status == "delivered"
    assert media_server.requests == ["/r.pdf"]
    sent = homeserver.stored[-1].content
    assert sent["msgtype"] == "m.file" and sent["body"] == "r.pdf"


async def test_an_unreadable_media_becomes_the_notice(homeserver: Homeserver, http: httpx.AsyncClient) -> None:
    bot = bot_config(homeserver, language="en")
    segment = {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.org/a.png"}}}
    [call] = platform.render(bot, outbound([segment]))
    assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    assert homeserver.stored[-1].content["body"] == "[attachment unavailable]"
    assert homeserver.uploads == {}


async def test_an_mxc_uri_is_sent_as_it_is_and_another_file_id_is_refused(
    homeserver: Homeserver, http: httpx.AsyncClient
) -> None:
    bot = bot_config(homeserver, language="en")
    own = {"type": "image", "data": {"media": {"kind": "file", "value": f"mxc://{SERVER}/abc"}}}
    foreign = {"type": "file", "data": {"media": {"kind": "file", "value": "/etc/passwd"}}}
    calls = platform.render(bot, outbound([own, foreign]))
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    assert homeserver.stored[0].content["url"] == f"mxc://{SERVER}/abc" and homeserver.uploads == {}
    assert homeserver.stored[1].content["body"] == "[attachment unavailable]"


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (429, {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many", "retry_after_ms": 2500}, ("retry", "rate_limited")),
        (403, {"errcode": "M_FORBIDDEN", "error": "not in room"}, ("permanent", "forbidden")),
        (502, {"errcode": "M_UNKNOWN", "error": "bad gateway"}, ("retry", "server_error")),
    ],
)
async def test_errors_are_classified(
    homeserver: Homeserver, http: httpx.AsyncClient, status: int, body: dict[str, Any], expected: tuple[str, str]
) -> None:
    bot = bot_config(homeserver)
    homeserver.scripts[ROOM] = [(status, body)]
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "x"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == expected
    if status == 429:
        assert outcome.retry_after == 2.5


async def test_a_wrong_token_is_unauthorized(homeserver: Homeserver, http: httpx.AsyncClient) -> None:
    bot = bot_config(homeserver).model_copy(update={"credentials": {"access_token": SecretStr("syt_revoked")}})
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "x"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "unauthorized")
    homeserver.errors.clear()  # the stand-in noted the refused token, as expected


async def test_typing(homeserver: Homeserver, http: httpx.AsyncClient) -> None:
    await get_platform("matrix").typing(bot_config(homeserver), ROOM, http)
    assert homeserver.typing == [(ROOM, {"typing": True, "timeout": 30000})]


# --- the application-service transport ------------------------------------------------------------


def appservice_config(homeserver: Homeserver, **extra: Any) -> BotConfig:
    return bot_config(homeserver, **extra).model_copy(
        update={
            "transport": "appservice",
            "credentials": {"hs_token": SecretStr(HS_TOKEN), "as_token": SecretStr(AS_TOKEN)},
        }
    )


def test_an_appservice_entry_needs_both_tokens_and_names_the_one_missing() -> None:
    tokens = {"hs_token": "h", "as_token": "a"}
    entry: dict[str, Any] = {
        "platform": "matrix",
        "bot_id": "m",
        "transport": "appservice",
        "self_id": BOT_USER,
        "api_base": "https://matrix.example.org",
        "credentials": tokens,
    }
    assert bot_problems([entry]) == []  # no access_token: the as_token stands for it
    for missing in ("hs_token", "as_token"):
        credentials = {k: v for k, v in tokens.items() if k != missing}
        [problem] = bot_problems([{**entry, "credentials": credentials}])
        assert problem.loc[1:] == ("credentials", missing)
        assert problem.message == "required for matrix appservice (bot 'm')"
    [problem] = bot_problems([{**entry, "transport": "sync"}])
    assert problem.loc[1:] == ("credentials", "access_token")


async def test_an_appservice_bot_sends_with_the_as_token_as_its_own_user(
    homeserver: Homeserver, http: httpx.AsyncClient
) -> None:
    bot = appservice_config(homeserver)
    image = {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}}
    text, media = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}, image]))
    for call in (text, text, media):  # the text retried: stored once
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    await platform.typing(bot, ROOM, http)
    assert len(homeserver.stored) == 2 and homeserver.send_attempts[text.path.rsplit("/", 1)[1]] == 2
    # Sent as the bot's user (`user_id` = self_id), not as the application service's sender.
    assert {homeserver.events[s.event_id]["sender"] for s in homeserver.stored} == {BOT_USER}
    assert homeserver.typing and homeserver.errors == []


async def test_an_appservice_bot_outside_the_namespace_is_forbidden(
    homeserver: Homeserver, http: httpx.AsyncClient
) -> None:
    bot = appservice_config(homeserver).model_copy(update={"self_id": f"@someone_else:{SERVER}"})
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "x"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "forbidden")
    assert homeserver.stored == []
    homeserver.errors.clear()  # the stand-in noted the refused masquerade, as expected
