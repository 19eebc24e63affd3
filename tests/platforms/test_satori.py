"""Satori: `message-created` events built with the official SDK's models (`satori-python-core`:
`Event`, `Login`, `MessageObject`, and message elements whose `str()` is the content a server
sends); outbound against a local stand-in of the HTTP API that checks what a Satori server checks
(the bearer token, the login headers, `channel_id` and `content`), the content read back with the
SDK's own element parser, so escaping is checked by the reader the other side uses."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from satori import At, Audio, Author, Bold, Channel, ChannelType, Guild, Image, Login, Member, MessageObject, Quote
from satori import Element as SatoriElement
from satori import Event as SatoriEvent
from satori import File as SatoriFile
from satori import Text as SatoriText
from satori import User as SatoriUser
from satori.element import Raw
from satori.model import LoginStatus

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.checks import bot_problems
from pipeline.platforms.satori import SatoriPlatform, escape_text
from pipeline.records import InboundMessage, OutboundMessage
from pipeline.segments import segment_list_adapter
from pipeline.settings import BotConfig, Settings
from pipeline.stages.outputs import Outputs
from pipeline.topics import IM_INBOUND
from pipeline.web import WebDeps, build_web_app

from .conftest import PNG, PNG_B64, Answer, FakeApi, Seen, broken_loader, load_media

TOKEN = "satori-server-token-7f3a"
LOGIN_PLATFORM = "discord"
BOT = "1100000000000000001"
OTHER_BOT = "9900000000000000009"  # another login of the same server
ALICE = "2200000000000000002"
BOB = "3300000000000000003"
GUILD = "4400000000000000004"
CHANNEL = "5500000000000000005"
DM_CHANNEL = "private:2200000000000000002"


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    values: dict[str, Any] = {
        "platform": "satori",
        "bot_id": "st1",
        "self_id": BOT,
        "credentials": {"token": TOKEN, "platform": LOGIN_PLATFORM},
        "api_base": api.url if api else None,
        "language": "en",
    }
    values.update(extra)
    return BotConfig(**values)


def login(self_id: str = BOT, platform: str = LOGIN_PLATFORM) -> Login:
    return Login(sn=1, status=LoginStatus.ONLINE, adapter="discord", platform=platform, user=SatoriUser(self_id))


def message_event(
    content: Sequence[SatoriElement] | str,
    *,
    group: bool = True,
    message_id: str = "7700000000000000007",
    user_id: str = ALICE,
    sn: int = 1,
    self_id: str = BOT,
    kind: str = "message-created",
    channel: str | None = None,
) -> dict[str, Any]:
    """A `message-created` event as a Satori server sends it (the SDK's `Event.dump()`)."""
    elements: list[SatoriElement] = [SatoriText(content)] if isinstance(content, str) else list(content)
    channel_id = channel or (CHANNEL if group else DM_CHANNEL)
    chan = Channel(channel_id, ChannelType.TEXT if group else ChannelType.DIRECT, name="general" if group else None)
    sender = SatoriUser(user_id, name="alice", nick="Alice")
    event = SatoriEvent(
        type=kind,
        timestamp=datetime.fromtimestamp(1_764_000_000),
        login=login(self_id),
        channel=chan,
        guild=Guild(GUILD, "the guild") if group else None,
        member=Member(nick="Ally") if group else None,
        user=sender,
        message=MessageObject.from_elements(message_id, elements, channel=chan, user=sender),
        sn=sn,
    )
    return event.dump()


def request(body: dict[str, Any], headers: dict[str, str] | None = None) -> WebhookRequest:
    return WebhookRequest(headers=headers or {}, body=json.dumps(body).encode())


def parse(body: dict[str, Any], bot: BotConfig | None = None) -> Any:
    return get_platform("satori").parse(bot or bot_config(), request(body))


# --- in --------------------------------------------------------------------------------------------


def test_a_group_message_mentioning_the_bot_is_addressed_to_it() -> None:
    result = parse(message_event([At(BOT), SatoriText(" what is "), At(BOB, name="bob"), SatoriText("'s role?")]))
    [m] = result.messages
    assert (m.chat_id, m.chat_type, m.sender.user_id, m.sender.name) == (CHANNEL, "group", ALICE, "Ally")
    assert m.mentions_bot and m.text == "what is @bob's role?"
    assert [s.type for s in m.segments] == ["text", "mention", "text"]
    assert m.mentions == [BOT, BOB] and m.mention_names == {BOB: "bob"}
    assert m.route == {"guild_id": GUILD} and m.sent_at_ms is not None


def test_a_group_message_without_a_mention_is_not_addressed_and_a_direct_one_always_is() -> None:
    [group] = parse(message_event("hello")).messages
    [direct] = parse(message_event("hello", group=False)).messages
    assert not group.mentions_bot and group.chat_type == "group"
    assert (direct.chat_type, direct.chat_id, direct.route) == ("private", DM_CHANNEL, {})


def test_a_quote_of_the_bots_message_is_a_reply_to_the_bot() -> None:
    quote = Quote("8800000000000000008")(Author(BOT), SatoriText("earlier answer"))
    [m] = parse(message_event([quote, SatoriText("and then?")])).messages
    assert m.reply_to is not None and m.reply_to.message_id == "8800000000000000008"
    assert m.reply_to.is_bot and m.reply_to.user_id == BOT and m.reply_to.text == "earlier answer"
    assert m.mentions_bot and m.text == "and then?"
    assert m.segments[0].type == "reply"


def test_at_all_is_text_and_not_a_mention() -> None:
    [m] = parse(message_event([At(type="all"), SatoriText(" news")])).messages
    assert m.text == "@all news" and m.mentions == [] and not m.mentions_bot


def test_a_quote_object_of_a_v1_1_message_is_a_reply_with_its_text() -> None:
    body = message_event("yes?", group=False)
    quoted = MessageObject.from_elements(
        "q-9", [Bold()(SatoriText("bold")), SatoriText(" & more")], user=SatoriUser(BOT)
    )
    body["message"]["quote"] = quoted.dump()
    [m] = parse(body).messages
    assert m.reply_to is not None and (m.reply_to.message_id, m.reply_to.text) == ("q-9", "bold & more")
    assert m.reply_to.is_bot and m.mentions_bot


def test_entities_and_markup_in_text_are_read_as_text() -> None:
    # The SDK escapes `<`, `>`, `&` in text: a user's "<at id=…/>" typed as text is no mention.
    [m] = parse(message_event(f'1 < 2 & "x" <at id="{BOT}"/>')).messages
    assert m.text == f'1 < 2 & "x" <at id="{BOT}"/>' and not m.mentions_bot


def test_media_by_url_are_segments_the_servers_own_are_its_references_and_data_placeholders() -> None:
    """External URLs are `url` media; `internal:` resources and URLs under the server's own
    `/v1/proxy/` are `file` media (read by Switchboard with the token); a `data:` source is the
    placeholder."""
    api = FakeApi()
    api.url = "http://127.0.0.1:5140/satori"
    proxied = f"{api.url}/v1/proxy/https://cdn.discordapp.com/attachments/1/b.png"
    content = [
        Image("https://cdn.example/a.png"),
        Audio("internal:discord/1/a.mp3"),
        SatoriFile("https://x/r.pdf"),
        Image(proxied),
        Image("data:image/png;base64," + PNG_B64),
    ]
    [m] = parse(message_event(content, group=False), bot_config(api)).messages
    shown = [
        (s.type, s.data.media.kind, s.data.media.value) if hasattr(s.data, "media") else (s.type, s.data.text)
        for s in m.segments
    ]
    assert shown == [
        ("image", "url", "https://cdn.example/a.png"),
        ("audio", "file", "internal:discord/1/a.mp3"),
        ("file", "url", "https://x/r.pdf"),
        ("image", "file", proxied),
        ("text", "[image]"),
    ]


def test_formatting_paragraphs_links_and_unknown_elements_are_read_as_their_text() -> None:
    # Raw content as a server may send it, with an element no spec names (`foo:bar`).
    raw = '<p>one <b>two</b></p><p><a href="https://e.x/">site</a> <a href="https://e.x/y"/></p>'
    raw += '<foo:bar>z</foo:bar><br/><sharp id="5" name="general"/>'
    [m] = parse(message_event([Raw(raw)], group=False)).messages
    assert m.text == "one two\nsite https://e.x/y\nz\n#general"


def test_other_logins_own_messages_and_other_events_are_ignored() -> None:
    assert parse(message_event([At(BOT), SatoriText(" hi")], self_id=OTHER_BOT)).ignored == "other_login"
    assert parse(message_event("mine", user_id=BOT)).ignored == "own_message"
    assert parse(message_event("x", kind="message-deleted")).ignored == "not_message"
    other_platform = bot_config(credentials={"token": TOKEN, "platform": "qq"})
    assert parse(message_event("hi", group=False), other_platform).ignored == "other_login"


def test_a_v1_0_event_naming_the_login_by_platform_and_self_id_is_read() -> None:
    body = message_event("hello", group=False)
    del body["login"]
    body.update(platform=LOGIN_PLATFORM, self_id=BOT)
    assert len(parse(body).messages) == 1


def test_a_malformed_event_is_a_400() -> None:
    with pytest.raises(WebhookRejected) as info:
        parse({"sn": 1, "type": "message-created", "login": login().dump(), "message": {"id": "1"}})
    assert info.value.status == 400


def test_the_webhook_needs_the_bearer_token() -> None:
    platform = get_platform("satori")
    bot = bot_config(transport="webhook")
    body = message_event("hi", group=False)
    platform.verify(bot, request(body, {"authorization": f"Bearer {TOKEN}", "satori-opcode": "0"}))
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
        with pytest.raises(WebhookRejected) as info:
            platform.verify(bot, request(body, headers))
        assert info.value.status == 401
    with pytest.raises(WebhookRejected):
        platform.verify(bot_config(transport="webhook", credentials={"platform": LOGIN_PLATFORM}), request(body))
    meta = request({"logins": []}, {"authorization": f"Bearer {TOKEN}", "satori-opcode": "5"})
    assert platform.parse(bot, meta).ignored == "meta"


def test_a_websocket_bot_without_a_token_is_warned_about_and_one_with_it_is_not() -> None:
    platform = get_platform("satori")
    [warning] = platform.startup_warnings(bot_config(transport="websocket", credentials={"platform": "qq"}))
    assert warning.startswith("no token credential")
    assert platform.startup_warnings(bot_config(transport="websocket")) == []


def test_a_non_ascii_authorization_is_a_401_never_another_error() -> None:
    body = message_event("hi", group=False)
    for raw in (b"Bearer \xc3\xa9t\xc3\xa9", b"\xff\xfe1"):
        headers = {"authorization": raw.decode("utf-8", "surrogateescape")}
        with pytest.raises(WebhookRejected) as refused:
            get_platform("satori").verify(bot_config(transport="webhook"), request(body, headers))
        assert refused.value.status == 401


def test_the_bots_file_needs_the_login() -> None:
    entry = {"platform": "satori", "bot_id": "s", "transport": "websocket", "credentials": {}}
    problems = {(p.loc[1:], p.message.split(" (")[0]) for p in bot_problems([entry])}
    assert (("self_id",), "required for Satori: the login's user id") in {
        (a, b.split(" (READY")[0]) for a, b in problems
    }
    assert any(loc == ("credentials", "platform") for loc, _ in problems)
    webhook = dict(entry, transport="webhook", self_id="1", credentials={"platform": "qq"})
    assert [p.loc[1:] for p in bot_problems([webhook])] == [("credentials", "token")]


# --- out -------------------------------------------------------------------------------------------


def outbound(segments: list[dict[str, Any]], chat: str = CHANNEL, **extra: Any) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-s",
        kind="reply",
        platform="satori",
        bot_id="st1",
        chat_id=chat,
        chat_type="group",
        conversation_key=f"satori:st1:{chat}",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


def read(content: str) -> list[SatoriElement]:
    """Content as a Satori server reads it (the SDK's parser)."""
    return MessageObject("1", content).message


def test_an_agents_text_cannot_form_elements() -> None:
    evil = '</quote><at type="all"/><img src="http://10.0.0.1/x"/> & &amp; "q"'
    [call] = SatoriPlatform().render(bot_config(), outbound([{"type": "text", "data": {"text": evil}}]))
    assert call.json is not None
    [text] = read(call.json["content"])
    assert isinstance(text, SatoriText) and text.text == evil


def test_long_text_is_split_at_4000_characters_each_piece_whole_elements() -> None:
    text = "&<" * 4500
    calls = SatoriPlatform().render(bot_config(), outbound([{"type": "text", "data": {"text": text}}]))
    assert len(calls) == 3
    pieces = []
    for call in calls:
        assert call.json is not None
        [piece] = read(call.json["content"])
        assert isinstance(piece, SatoriText) and len(piece.text) <= 4000
        pieces.append(piece.text)
    assert "".join(pieces) == text


def test_mentions_markdown_and_the_reply_are_elements() -> None:
    segments = [
        {"type": "mention", "data": {"target": BOB}},
        {"type": "markdown", "data": {"content": " **bold** and [a link](https://e.x/?a=1&b=2)"}},
    ]
    [call] = SatoriPlatform().render(bot_config(), outbound(segments, reply_to_message_id="m-1"))
    assert call.path == "/message.create" and call.json is not None and call.json["channel_id"] == CHANNEL
    quote, at, _space, bold, _and, link = read(call.json["content"])
    assert isinstance(quote, Quote) and quote.id == "m-1"
    assert isinstance(at, At) and at.id == BOB
    assert isinstance(bold, Bold) and str(bold.children[0]) == "bold"
    assert link.tag == "a" and link.href == "https://e.x/?a=1&b=2"  # type: ignore[attr-defined]


def test_media_are_messages_of_their_own_and_file_ids_the_notice() -> None:
    segments = [
        {"type": "text", "data": {"text": "look"}},
        {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
        {"type": "file", "data": {"media": {"kind": "file", "value": "abc"}}},
    ]
    calls = SatoriPlatform().render(bot_config(), outbound(segments, reply_to_message_id="m-2"))
    assert [c.media is not None for c in calls] == [False, True, False]
    assert calls[0].json is not None and calls[0].json["content"].startswith('<quote id="m-2"/>')
    assert calls[2].json is not None and calls[2].json["content"] == "[attachment unavailable]"


def check_satori(seen: Seen) -> Answer:
    """What a Satori server refuses, refused the way Koishi's server-satori does."""
    if seen.headers.get("authorization") != f"Bearer {TOKEN}":
        return 401, "Unauthorized"
    if seen.headers.get("satori-platform") != LOGIN_PLATFORM or seen.headers.get("satori-user-id") != BOT:
        return 403, "Forbidden"
    assert seen.path == "/v1/message.create" and seen.method == "POST"
    assert set(seen.json) == {"channel_id", "content"}
    assert seen.json["content"]
    read(seen.json["content"])  # the server's parser takes it
    created = MessageObject.from_elements(
        "8800000000000000001", read(seen.json["content"]), Channel(seen.json["channel_id"])
    )
    return 200, [created.dump()]


async def test_send_posts_message_create_with_the_login_headers(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/v1/message.create", check_satori)
    platform = SatoriPlatform()
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi <there>"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.platform_message_id) == ("delivered", "8800000000000000001")
    [seen] = api.calls("/v1/message.create")
    assert seen.headers["x-platform"] == LOGIN_PLATFORM and seen.headers["x-self-id"] == BOT
    assert seen.json["content"] == "hi &lt;there&gt;"


async def test_media_go_inline_as_data_urls(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/v1/message.create", check_satori)
    platform = SatoriPlatform()
    bot = bot_config(api)
    segments = [{"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}}]
    [call] = platform.render(bot, outbound(segments))
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    [image] = read(api.calls("/v1/message.create")[0].json["content"])
    assert isinstance(image, Image) and image.src.startswith("data:image/png;base64,")
    assert base64.b64decode(image.src.split(",", 1)[1]) == PNG
    outcome = await platform.send(bot, call, http, broken_loader)
    assert outcome.status == "delivered"
    assert api.calls("/v1/message.create")[1].json["content"] == escape_text("[attachment unavailable]")


@pytest.mark.parametrize(
    ("status", "verdict", "reason"),
    [
        (401, "permanent", "unauthorized"),
        (400, "permanent", "bad_request"),
        (500, "retry", "server_error"),
        (429, "retry", "rate_limited"),
    ],
)
async def test_errors_are_classified(
    api: FakeApi, http: httpx.AsyncClient, status: int, verdict: str, reason: str
) -> None:
    api.reply("/v1/message.create", status, "nope")
    platform = SatoriPlatform()
    bot = bot_config(api, credentials={"token": "wrong", "platform": LOGIN_PLATFORM})
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == (verdict, reason)


@settings(max_examples=300, deadline=None)
@given(
    content=st.lists(st.sampled_from([*'<>/&;"= abiq#xt:', "at", "quote", "&amp;", "&#", "<!--"]), max_size=40).map(
        "".join
    )
)
def test_any_content_is_read_or_refused_as_a_400(content: str) -> None:
    """Content is the sender's: whatever it holds, a message or a 400, never another exception."""
    body = message_event([Raw(content)], group=False)
    try:
        parse(body)
    except WebhookRejected as exc:
        assert exc.status == 400


# --- the webhook, over real HTTP to the worker's web app ---------------------------------------------


@pytest.fixture
async def web_app(redis_url: str, redis_prefix: str) -> AsyncIterator[tuple[str, list[tuple[str, bytes]]]]:
    """The worker's web app with a Satori webhook bot; what it would produce is recorded."""
    settings = Settings(redis_prefix=redis_prefix, bots=[bot_config()])
    produced: list[tuple[str, bytes]] = []

    async def produce(topic: str, key: str | None, value: bytes) -> None:
        produced.append((topic, value))

    async def ready() -> dict[str, bool]:
        return {"started": True}

    deps = WebDeps(settings=settings, produce=produce, outputs=Outputs(produce), ready=ready)
    runner = web.AppRunner(build_web_app(deps))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/webhooks/satori/st1", produced
    finally:
        await runner.cleanup()


async def test_a_forged_webhook_is_refused_and_produces_nothing(
    web_app: tuple[str, list[tuple[str, bytes]]], http: httpx.AsyncClient
) -> None:
    url, produced = web_app
    body = json.dumps(message_event([At(BOT), SatoriText(" hi")])).encode()
    for headers in ({"Authorization": "Bearer forged"}, {}):
        response = await http.post(url, content=body, headers={**headers, "Satori-OpCode": "0"})
        assert response.status_code == 401
    assert produced == []
    genuine = {"Authorization": f"Bearer {TOKEN}", "Satori-OpCode": "0", "Content-Type": "application/json"}
    assert (await http.post(url, content=body, headers=genuine)).status_code == 200
    [(topic, value)] = produced
    assert topic == IM_INBOUND and InboundMessage.model_validate_json(value).mentions_bot
