"""LINE Messaging API: webhooks built with line-bot-sdk's v3 webhook models (and read back by its
`WebhookParser`, which checks the signature as LINE's SDKs do), sent to a stand-in of the Messaging
API that checks each request the way LINE does: the channel access token, the body read by the
SDK's own request models, reply tokens single use and short-lived, retry keys, message limits."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import time
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linebot.v3 import WebhookParser
from linebot.v3.messaging import (
    MentionSubstitutionObject,
    PushMessageRequest,
    ReplyMessageRequest,
    ShowLoadingAnimationRequest,
    TextMessageV2,
    UserMentionTarget,
)
from linebot.v3.webhooks import (
    AllMentionee,
    CallbackRequest,
    ContentProvider,
    DeliveryContext,
    FollowEvent,
    GroupSource,
    ImageMessageContent,
    Mention,
    MessageEvent,
    RoomSource,
    TextMessageContent,
    UserMentionee,
    UserSource,
)
from prometheus_client import REGISTRY

from pipeline.platforms import PlatformCall, WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.line import LOADING_PATH, PUSH_PATH, REPLY_PATH, LinePlatform, retry_key
from pipeline.records import OutboundMessage, conversation_key, now_ms
from pipeline.settings import BotConfig
from tests.platforms import test_fuzz as fuzz
from tests.platforms.conftest import FakeApi, Seen, load_media

CHANNEL_SECRET = "8c570fa6dd201bb328f1c1eac23a96d8"
ACCESS_TOKEN = "line-channel-access-token-0123456789"
BOT_USER = "U" + "b0" * 16
ALICE = "U" + "a1" * 16
CAROL = "U" + "c3" * 16
GROUP = "C" + "9e" * 16
ROOM = "R" + "7d" * 16

line: LinePlatform = get_platform("line")  # type: ignore[assignment]


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="line",
        bot_id="ln1",
        self_id=BOT_USER,
        credentials={"channel_secret": CHANNEL_SECRET, "channel_access_token": ACCESS_TOKEN},
        api_base=api.url if api else None,
        language="en",
        **extra,
    )


# -- inbound: line-bot-sdk's webhook models ----------------------------------------------------------

_ids = itertools.count(1)


def text_event(
    text: str,
    *,
    source: Any,
    mentionees: list[Any] | None = None,
    message_id: str | None = None,
    event_id: str | None = None,
    reply_token: str | None = None,
    redelivery: bool = False,
    timestamp_ms: int | None = None,
    quoted: str | None = None,
) -> MessageEvent:
    n = next(_ids)
    return MessageEvent(
        source=source,
        timestamp=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        mode="active",
        webhook_event_id=event_id or f"01HLINE{n:019d}",
        delivery_context=DeliveryContext(is_redelivery=redelivery),
        reply_token=reply_token or uuid.uuid4().hex,
        message=TextMessageContent(
            id=message_id or str(500_000_000_000 + n),
            text=text,
            quote_token=f"q-{n}",
            mention=Mention(mentionees=mentionees) if mentionees else None,
            quoted_message_id=quoted,
        ),
    )


def private_text(text: str, user: str = ALICE, **kw: Any) -> MessageEvent:
    return text_event(text, source=UserSource(user_id=user), **kw)


def group_mention(text: str, group: str = GROUP, user: str = ALICE, **kw: Any) -> MessageEvent:
    """`@Switchboard <text>` in a group, the bot mentioned (`isSelf`) as LINE sends it."""
    mention = UserMentionee(index=0, length=len("@Switchboard"), user_id=BOT_USER, is_self=True)
    return text_event(
        f"@Switchboard {text}", source=GroupSource(group_id=group, user_id=user), mentionees=[mention], **kw
    )


def body_of(*events: Any, destination: str = BOT_USER) -> bytes:
    return CallbackRequest(destination=destination, events=list(events)).to_json().encode()


def signature(body: bytes, secret: str = CHANNEL_SECRET) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def signed(*events: Any, secret: str = CHANNEL_SECRET) -> WebhookRequest:
    body = body_of(*events)
    sig = signature(body, secret)
    if secret == CHANNEL_SECRET:
        WebhookParser(CHANNEL_SECRET).parse(body.decode(), sig)  # the SDK accepts what LINE would send
    headers = {"x-line-signature": sig, "content-type": "application/json; charset=utf-8"}
    return WebhookRequest(headers=headers, body=body, received_at_ms=time.time() * 1000)


def test_signature_is_checked_before_anything_reads_the_body() -> None:
    bot = bot_config()
    request = signed(private_text("hi"))
    line.verify(bot, request)
    forged = signed(private_text("hi"), secret="not-the-channel-secret")
    with pytest.raises(WebhookRejected) as refused:
        line.verify(bot, forged)
    assert (refused.value.status, refused.value.reason) == (401, "bad_signature")
    tampered = WebhookRequest(headers=request.headers, body=request.body.replace(b"hi", b"ho"))
    for bad in (tampered, WebhookRequest(headers={}, body=request.body)):
        with pytest.raises(WebhookRejected):
            line.verify(bot, bad)
    with pytest.raises(WebhookRejected):  # not ASCII: never a 500
        line.verify(bot, WebhookRequest(headers={"x-line-signature": "é" * 44}, body=request.body))
    with pytest.raises(WebhookRejected):  # no channel secret: nothing is accepted
        line.verify(bot_config().model_copy(update={"credentials": {}}), request)


def test_private_text_is_addressed_with_its_reply_token() -> None:
    event = private_text("hello there")
    [message] = line.parse(bot_config(), signed(event)).messages
    assert (message.chat_id, message.chat_type, message.sender.user_id) == (ALICE, "private", ALICE)
    assert message.text == "hello there" and message.mentions_bot
    assert message.event_id == event.webhook_event_id and message.message_id == event.message.id
    assert message.route["reply_token"] == event.reply_token
    assert message.route["quote_token"] == event.message.quote_token
    assert int(message.route["at_ms"]) == event.timestamp


def test_group_mention_of_the_bot_triggers_and_other_mentions_are_kept() -> None:
    carol = UserMentionee(index=20, length=6, user_id=CAROL)  # UTF-16: the emoji counts twice
    everyone = AllMentionee(index=27, length=4)
    bot = UserMentionee(index=0, length=12, user_id=BOT_USER, is_self=True)
    event = text_event(
        "@Switchboard 👋 ask @Carol @All please",
        source=GroupSource(group_id=GROUP, user_id=ALICE),
        mentionees=[bot, carol, everyone],
    )
    [message] = line.parse(bot_config(), signed(event)).messages
    assert message.chat_type == "group" and message.chat_id == GROUP and message.mentions_bot
    assert message.mentions == [CAROL] and message.mention_names == {CAROL: "Carol"}
    assert message.text == "👋 ask @Carol @All please"
    assert [s.type for s in message.segments] == ["text", "mention", "text"]
    assert message.conversation_key == conversation_key("line", "ln1", GROUP)


def test_group_message_without_the_bot_is_context_and_room_is_a_group() -> None:
    plain = text_event("just chatting", source=GroupSource(group_id=GROUP, user_id=ALICE))
    room = text_event("in a room", source=RoomSource(room_id=ROOM, user_id=ALICE))
    first, second = line.parse(bot_config(), signed(plain, room)).messages  # one webhook, two events
    assert not first.mentions_bot and first.chat_type == "group"
    assert second.chat_id == ROOM and second.chat_type == "group"


def test_redelivery_keeps_its_event_id_so_ingest_drops_it() -> None:
    event = private_text("once")
    again = event.copy(update={"delivery_context": DeliveryContext(is_redelivery=True)})
    [a] = line.parse(bot_config(), signed(event)).messages
    [b] = line.parse(bot_config(), signed(again)).messages
    assert a.event_id == b.event_id == event.webhook_event_id


def test_events_that_are_not_messages_and_the_console_verify_are_ignored() -> None:
    follow = FollowEvent.from_dict(
        {
            "type": "follow",
            "source": {"type": "user", "userId": ALICE},
            "timestamp": 1,
            "mode": "active",
            "webhookEventId": "01HFOLLOW",
            "deliveryContext": {"isRedelivery": False},
            "replyToken": "r",
            "follow": {"isUnblocked": False},
        }
    )
    assert line.parse(bot_config(), signed(follow)).ignored == "not_message"
    assert line.parse(bot_config(), signed()).ignored == "not_message"  # the console's "Verify"


def test_image_is_line_content_by_id_or_an_external_url_and_a_quote_is_reply_to() -> None:
    image = MessageEvent(
        source=UserSource(user_id=ALICE),
        timestamp=1,
        mode="active",
        webhook_event_id="01HIMG",
        delivery_context=DeliveryContext(is_redelivery=False),
        reply_token="rt",
        message=ImageMessageContent(id="777", content_provider=ContentProvider(type="line"), quote_token="q"),
    )
    [message] = line.parse(bot_config(), signed(image)).messages
    assert message.segments[0].type == "image" and message.segments[0].data.media.model_dump() == {
        "kind": "file",
        "value": "777",
    }
    external = image.copy(
        update={
            "message": ImageMessageContent(
                id="778",
                content_provider=ContentProvider(type="external", original_content_url="https://example.com/a.png"),
                quote_token="q",
            )
        }
    )
    [message] = line.parse(bot_config(), signed(external)).messages
    assert message.segments[0].model_dump()["data"]["media"]["kind"] == "url"
    [quoting] = line.parse(bot_config(), signed(private_text("this one", quoted="42"))).messages
    assert quoting.reply_to is not None and quoting.reply_to.message_id == "42"


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"events": [1]}',
        b'{"events": [{"type": "message", "source": {"type": "user"}, "message": {"id": "1"}}]}',
    ],
)
def test_malformed_webhooks_are_400(body: bytes) -> None:
    with pytest.raises(WebhookRejected) as refused:
        line.parse(bot_config(), WebhookRequest(headers={}, body=body))
    assert refused.value.status == 400


# -- outbound: a stand-in of the Messaging API -----------------------------------------------------

_LINE_ID = re.compile(r"[UCR][0-9a-f]{32}")
_KEY = re.compile(r"\{([a-zA-Z0-9_]{1,20})\}")


def check_message_object(obj: dict[str, Any]) -> None:
    """One message object as LINE validates it."""
    kind = obj["type"]
    assert kind in ("text", "textV2", "image"), kind
    if kind == "text":
        assert 0 < len(obj["text"]) <= 5000 and set(obj) <= {"type", "text", "quoteToken", "emojis"}
    elif kind == "textV2":
        assert 0 < len(obj["text"]) <= 5000 and set(obj) <= {"type", "text", "quoteToken", "substitution"}
        unbraced = obj["text"].replace("{{", "").replace("}}", "")
        keys = set(_KEY.findall(unbraced))
        assert "{" not in _KEY.sub("", unbraced) and "}" not in _KEY.sub("", unbraced), obj["text"]
        assert keys == set(obj.get("substitution", {})), (keys, obj)
        for value in obj["substitution"].values():
            assert value["type"] == "mention" and _LINE_ID.fullmatch(value["mentionee"]["userId"])
    else:
        for field in ("originalContentUrl", "previewImageUrl"):
            assert obj[field].startswith("https://") and len(obj[field]) <= 2000


class LineStandIn:
    """Reply, push and the loading animation, refusing what LINE refuses. `received(token)` makes
    a reply token valid (as a webhook carrying it would)."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.tokens: dict[str, float] = {}  # reply token → when it was issued (time.time())
        self.retry_keys: dict[str, str] = {}  # X-Line-Retry-Key → the request id that took it
        self.loading: list[str] = []
        self._ids = itertools.count(1)
        api.on(REPLY_PATH, self.reply)
        api.on(PUSH_PATH, self.push)
        api.on(LOADING_PATH, self.loading_start)

    def received(self, token: str, at: float | None = None) -> None:
        self.tokens[token] = time.time() if at is None else at

    def _auth(self, seen: Seen) -> tuple[int, Any] | None:
        if seen.headers.get("authorization") != f"Bearer {ACCESS_TOKEN}":
            return 401, {
                "message": "Authentication failed. Confirm that the access token in the authorization header is valid."
            }
        assert seen.method == "POST" and seen.headers["content-type"].startswith("application/json")
        return None

    def _sent(self, messages: list[dict[str, Any]]) -> tuple[int, Any, dict[str, str]]:
        assert 1 <= len(messages) <= 5
        for obj in messages:
            check_message_object(obj)
        request_id = f"req-{next(self._ids)}"
        sent = [{"id": str(900_000 + next(self._ids)), "quoteToken": "qt"} for _ in messages]
        return 200, {"sentMessages": sent}, {"x-line-request-id": request_id}

    def reply(self, seen: Seen) -> Any:
        refused = self._auth(seen)
        if refused:
            return refused
        assert "x-line-retry-key" not in seen.headers  # the reply API takes none
        ReplyMessageRequest.from_json(seen.body.decode())  # the SDK reads it: LINE's schema
        assert set(seen.json) <= {"replyToken", "messages", "notificationDisabled"}
        issued = self.tokens.pop(seen.json["replyToken"], None)
        if issued is None or time.time() - issued > 60:
            return 400, {"message": "Invalid reply token"}
        return self._sent(seen.json["messages"])

    def push(self, seen: Seen) -> Any:
        refused = self._auth(seen)
        if refused:
            return refused
        PushMessageRequest.from_json(seen.body.decode())
        assert set(seen.json) <= {"to", "messages", "notificationDisabled", "customAggregationUnits"}
        assert _LINE_ID.fullmatch(seen.json["to"]), seen.json["to"]
        key = seen.headers.get("x-line-retry-key")
        if key is not None:
            assert str(uuid.UUID(key)) == key.lower()
            if key in self.retry_keys:
                accepted = self.retry_keys[key]
                return 409, {"message": "The retry key is already accepted"}, {"x-line-accepted-request-id": accepted}
        answer = self._sent(seen.json["messages"])
        if key is not None:
            self.retry_keys[key] = answer[2]["x-line-request-id"]
        return answer

    def loading_start(self, seen: Seen) -> Any:
        refused = self._auth(seen)
        if refused:
            return refused
        request = ShowLoadingAnimationRequest.from_json(seen.body.decode())
        assert request.chat_id.startswith("U") and _LINE_ID.fullmatch(request.chat_id)
        seconds = request.loading_seconds
        assert seconds is not None and 5 <= seconds <= 60 and seconds % 5 == 0
        self.loading.append(request.chat_id)
        return 202, {}


def outbound(chat: str, segments: list[dict[str, Any]], route: dict[str, str], **extra: Any) -> OutboundMessage:
    return OutboundMessage.model_validate(
        {
            "outbound_id": extra.pop("outbound_id", f"out-{next(_ids)}"),
            "kind": "reply",
            "platform": "line",
            "bot_id": "ln1",
            "chat_id": chat,
            "chat_type": "private" if chat.startswith("U") else "group",
            "conversation_key": conversation_key("line", "ln1", chat),
            "segments": segments,
            "route": route,
            **extra,
        }
    )


def fresh_route(standin: LineStandIn | None = None, *, age_s: float = 0.0) -> dict[str, str]:
    token = uuid.uuid4().hex
    at = time.time() - age_s
    if standin is not None:
        standin.received(token, at)
    return {"reply_token": token, "at_ms": str(int(at * 1000)), "quote_token": "q-1"}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": value}}


def body(call: PlatformCall) -> dict[str, Any]:
    assert call.json is not None
    return call.json


def notices(name: str) -> float:
    return REGISTRY.get_sample_value("switchboard_notices_total", {"platform": "line", "notice": name}) or 0.0


def test_render_mentions_as_textv2_with_braces_escaped_and_the_first_text_quoting() -> None:
    message = outbound(
        GROUP,
        [
            {"type": "reply", "data": {"message_id": "1"}},
            {"type": "mention", "data": {"target": CAROL}},
            text(" see {this} and "),
            {"type": "mention", "data": {"target": CAROL}},
            {"type": "mention", "data": {"target": "not-a-line-id"}},
        ],
        fresh_route(),
    )
    [call] = line.render(bot_config(), message)
    assert call.path == REPLY_PATH
    [obj] = body(call)["messages"]
    assert obj == {
        "type": "textV2",
        "text": "{m0} see {{this}} and {m0}@not-a-line-id",
        "substitution": {"m0": {"type": "mention", "mentionee": {"type": "user", "userId": CAROL}}},
        "quoteToken": "q-1",
    }
    check_message_object(obj)
    # In a one-to-one chat nobody can be mentioned: the text as written.
    [call] = line.render(bot_config(), outbound(ALICE, [{"type": "mention", "data": {"target": CAROL}}], fresh_route()))
    assert body(call)["messages"] == [{"type": "text", "text": f"@{CAROL}"}]


def test_render_images_by_https_url_only_and_more_than_five_objects_push() -> None:
    segments = [text("look")]
    for i in range(6):
        segments.append({"type": "image", "data": {"media": {"kind": "url", "value": f"https://img.example/{i}.png"}}})
    segments.append({"type": "image", "data": {"media": {"kind": "base64", "value": "aGk="}}})
    segments.append({"type": "file", "data": {"media": {"kind": "url", "value": "https://files.example/r.pdf"}}})
    first, second = line.render(bot_config(), outbound(ALICE, segments, fresh_route()))
    assert first.path == REPLY_PATH and len(body(first)["messages"]) == 5
    assert second.path == PUSH_PATH and body(second)["to"] == ALICE and len(body(second)["messages"]) == 3
    assert body(second)["messages"][-1]["type"] == "text"
    assert body(second)["messages"][-1]["text"] == "[attachment unavailable] https://files.example/r.pdf"
    for obj in body(first)["messages"] + body(second)["messages"]:
        check_message_object(obj)


async def test_reply_with_a_fresh_token_then_the_used_token_is_pushed_only_when_allowed(
    api: FakeApi, http: httpx.AsyncClient
) -> None:
    standin = LineStandIn(api)
    route = fresh_route(standin)
    [call] = line.render(bot_config(api), outbound(ALICE, [text("first")], route))
    outcome = await line.send(bot_config(api), call, http, load_media)
    assert outcome.status == "delivered" and outcome.platform_message_id
    # A second message of the same turn: the token is used; without pushes, a named failure.
    [again] = line.render(bot_config(api), outbound(ALICE, [text("second")], route, outbound_id="o-2"))
    outcome = await line.send(bot_config(api), again, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "reply_token_expired")
    assert "active_messages = false" in outcome.detail
    before = notices("push_fallback")
    outcome = await line.send(bot_config(api, active_messages=True), again, http, load_media)
    assert outcome.status == "delivered" and notices("push_fallback") == before + 1
    [push] = api.calls(PUSH_PATH)
    assert push.json == {"to": ALICE, "messages": [{"type": "text", "text": "second"}]}
    assert push.headers["x-line-retry-key"] == retry_key("o-2", 0)
    # The same push again (a replay after a crash): LINE answers 409 for its retry key, taken as sent.
    outcome = await line.send(bot_config(api, active_messages=True), again, http, load_media)
    assert outcome.status == "delivered" and len(api.calls(PUSH_PATH)) == 2 and len(standin.retry_keys) == 1


async def test_an_expired_token_is_not_even_tried(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = LineStandIn(api)
    route = fresh_route(standin, age_s=55)
    [call] = line.render(bot_config(api), outbound(GROUP, [text("late")], route))
    outcome = await line.send(bot_config(api), call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "reply_token_expired")
    assert api.seen == []
    outcome = await line.send(bot_config(api, active_messages=True), call, http, load_media)
    assert outcome.status == "delivered" and [s.path for s in api.seen] == [PUSH_PATH]


async def test_errors_are_classified(api: FakeApi, http: httpx.AsyncClient) -> None:
    bot = bot_config(api, active_messages=True)
    [call] = line.render(bot, outbound(ALICE, [text("x")], {}))
    assert call.path == PUSH_PATH
    cases: list[tuple[int, dict[str, Any], dict[str, str], tuple[str, str]]] = [
        (429, {"message": "You have reached your monthly limit."}, {}, ("permanent", "push_quota")),
        (429, {"message": "The API rate limit has been exceeded. Try again later."}, {}, ("retry", "rate_limited")),
        (500, {"message": "Internal error"}, {}, ("retry", "server_error")),
        (
            400,
            {
                "message": "The request body has 1 error(s)",
                "details": [{"message": "May not be empty", "property": "messages[0].text"}],
            },
            {},
            ("permanent", "bad_request"),
        ),
        (401, {"message": "Authentication failed."}, {}, ("permanent", "unauthorized")),
    ]
    for status, answer, headers, expected in cases:
        api.reply(PUSH_PATH, status, answer, headers, once=True)
        outcome = await line.send(bot, call, http, load_media)
        assert (outcome.status, outcome.reason) == expected, (status, answer, outcome)
    assert "messages[0].text: May not be empty" in (await _one(api, http, bot, call, 400, cases[3][1])).detail
    # Pushes off: a message answering nothing is refused without a call.
    outcome = await line.send(bot_config(api), call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "active_messages_off")


async def _one(api: FakeApi, http: httpx.AsyncClient, bot: BotConfig, call: Any, status: int, body: Any) -> Any:
    api.reply(PUSH_PATH, status, body, once=True)
    return await line.send(bot, call, http, load_media)


async def test_loading_animation_in_one_to_one_chats_only(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = LineStandIn(api)
    await line.typing(bot_config(api), ALICE, http)
    await line.typing(bot_config(api), GROUP, http)
    await line.typing(bot_config(api), ROOM, http)
    assert standin.loading == [ALICE] and len(api.seen) == 1


def test_reply_deadline_is_the_reply_tokens_life() -> None:
    route = fresh_route()
    deadline = line.reply_deadline_ms(bot_config(), ALICE, route)
    assert deadline == int(route["at_ms"]) + 50_000
    assert line.reply_deadline_ms(bot_config(), ALICE, {"at_ms": "1"}) is None
    assert deadline > now_ms()


def test_settings_require_both_credentials() -> None:
    from pipeline.platforms.checks import bot_problems

    problems = bot_problems([{"platform": "line", "bot_id": "x", "credentials": {"channel_secret": "s"}}])
    assert [(p.loc, p.message) for p in problems] == [
        ((0, "credentials", "channel_access_token"), "required for line (bot 'x')")
    ]


def test_sdk_reads_the_request_bodies_switchboard_sends() -> None:
    segments = [{"type": "mention", "data": {"target": CAROL}}, text(" hi")]
    [call] = line.render(bot_config(), outbound(GROUP, segments, fresh_route()))
    request = ReplyMessageRequest.from_json(json.dumps(call.json))
    [message] = request.messages
    assert isinstance(message, TextMessageV2) and message.substitution is not None
    mention = message.substitution["m0"]
    assert isinstance(mention, MentionSubstitutionObject) and isinstance(mention.mentionee, UserMentionTarget)
    assert mention.mentionee.user_id == CAROL


# -- fuzzed: one field of a valid webhook replaced by any JSON value: parsed or a 400, never a crash ---


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), new=fuzz.json_values)
def test_fuzzed_webhooks_parse_or_are_refused(data: st.DataObject, new: Any) -> None:
    carol = UserMentionee(index=16, length=6, user_id=CAROL)
    fixture = json.loads(body_of(group_mention("hi @Carol"), private_text("yo", quoted="1")))
    fixture["events"][0]["message"]["mention"]["mentionees"].append(carol.to_dict())
    path = data.draw(st.sampled_from(fuzz._paths(fixture)))  # noqa: SLF001
    try:
        result = line.parse(
            bot_config(), WebhookRequest(headers={}, body=json.dumps(fuzz._replace(fixture, path, new)).encode())
        )
    except WebhookRejected as exc:
        assert exc.status == 400 and exc.reason in fuzz.REASONS
        return
    assert result.ignored in fuzz.IGNORED
    for message in result.messages:
        message.model_dump_json()
