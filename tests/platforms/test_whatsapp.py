"""WhatsApp Cloud API: webhooks in the documented shapes (each read back by pywa, whose own checks
must accept the signature and find the same ids), sent to a stand-in of the Graph API that checks each
request the way WhatsApp does: the bearer token, the message body, the quoted and reacted-to
message ids, uploaded media ids and the 24-hour customer-service window. The stand-in is itself
checked against pywa's client: what pywa sends for a text, a reply, a reaction and an image, it
accepts."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from pydantic import SecretStr
from pywa import WhatsApp, utils
from pywa.errors import WhatsAppError
from pywa.types import Message, MessageStatus

from pipeline.platforms import PlatformCall, WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.whatsapp import WhatsAppPlatform
from pipeline.records import OutboundMessage, conversation_key
from pipeline.segments import SafeFetcher
from pipeline.segments.exceptions import MediaUnavailable
from pipeline.segments.models import Media
from pipeline.settings import BotConfig
from tests.platforms import test_fuzz as fuzz
from tests.platforms.conftest import PNG, PNG_B64, FakeApi, Seen, broken_loader, load_media

APP_SECRET = "0f4e6a0d7c9b41e8a3b2c1d0e9f8a7b6"
ACCESS_TOKEN = "EAAG-whatsapp-system-user-token"
VERIFY_TOKEN = "switchboard-verify-3141"
PHONE_ID = "106540352242922"
BUSINESS_NUMBER = "15550783881"
WABA = "102290129340398"
ALICE = "16315551234"
ALICE_BSUID = "US.13491208655302741918"
GROUP = "Y2FwaV9ncm91cDoxNTU1MDc4Mzg4MToxMjAzNjMwNDAxMjM0NTY3ODk="

whatsapp: WhatsAppPlatform = get_platform("whatsapp")  # type: ignore[assignment]
_n = itertools.count(1)


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="whatsapp",
        bot_id="wa1",
        self_id=BUSINESS_NUMBER,
        credentials={
            "access_token": ACCESS_TOKEN,
            "app_secret": APP_SECRET,
            "verify_token": VERIFY_TOKEN,
            "phone_number_id": PHONE_ID,
        },
        api_base=api.url if api else None,
        language="en",
        **extra,
    )


def pywa_client(session: httpx.Client | None = None) -> WhatsApp:
    return WhatsApp(
        phone_id=PHONE_ID,
        token=ACCESS_TOKEN,
        server=None,
        verify_token=VERIFY_TOKEN,
        app_secret=APP_SECRET,
        session=session or httpx.Client(),
    )


# -- inbound: the documented webhook payloads -----------------------------------------------------


def wamid() -> str:
    return f"wamid.HBgLMTYzMTU1NTEyMzQVAgASGBQz{next(_n):012d}"


def update(
    *messages: dict[str, Any], statuses: list[dict[str, Any]] | None = None, user: str = ALICE
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": BUSINESS_NUMBER, "phone_number_id": PHONE_ID},
    }
    value["contacts"] = [{"profile": {"name": "Alice"}, "wa_id": user, "user_id": ALICE_BSUID}]
    if messages:
        value["messages"] = list(messages)
    if statuses:
        value["statuses"] = statuses
    return {
        "object": "whatsapp_business_account",
        "entry": [{"id": WABA, "changes": [{"value": value, "field": "messages"}]}],
    }


def text_message(
    body: str,
    *,
    user: str = ALICE,
    group: str | None = None,
    message_id: str | None = None,
    sent: float | None = None,
    context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "from": user,
        "from_user_id": ALICE_BSUID,
        "id": message_id or wamid(),
        "timestamp": str(int(time.time() if sent is None else sent)),
        "type": "text",
        "text": {"body": body},
    }
    if group is not None:
        message["group_id"] = group
    if context is not None:
        message["context"] = context
    return message


def read_back(payload: dict[str, Any]) -> Message:
    """pywa's own reading of the update: the fixture is a payload WhatsApp could have sent."""
    return Message.from_update(client=pywa_client(), update=payload)  # type: ignore[arg-type]


def signature(body: bytes, secret: str = APP_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signed(payload: dict[str, Any], *, secret: str = APP_SECRET) -> WebhookRequest:
    body = json.dumps(payload, ensure_ascii=False).encode()
    header = signature(body, secret)
    assert utils.webhook_updates_validator(app_secret=APP_SECRET, request_body=body, x_hub_signature=header) == (
        secret == APP_SECRET
    )
    headers = {utils.HUB_SIG.lower(): header, "content-type": "application/json"}
    return WebhookRequest(headers=headers, body=body, received_at_ms=time.time() * 1000)


def challenge(token: str = VERIFY_TOKEN, value: str = "1158201444", mode: str = "subscribe") -> WebhookRequest:
    query = {"hub.mode": mode, utils.HUB_VT: token, utils.HUB_CH: value}
    return WebhookRequest(headers={}, body=b"", query=query, method="GET")


def test_the_subscription_check_answers_the_challenge_only_with_the_verify_token() -> None:
    bot = bot_config()
    request = challenge()
    whatsapp.verify(bot, request)
    result = whatsapp.parse(bot, request)
    assert result.text == "1158201444" and not result.messages
    assert pywa_client().webhook_challenge_handler(VERIFY_TOKEN, "1158201444") == (result.text, 200)
    for bad in (
        challenge(token="guess"),
        challenge(mode="unsubscribe"),
        WebhookRequest(headers={}, body=b"", method="GET"),
    ):
        with pytest.raises(WebhookRejected) as refused:
            whatsapp.verify(bot, bad)
        assert refused.value.status == 401
    with pytest.raises(WebhookRejected) as refused:  # echoed back: nothing but Meta's shape
        whatsapp.parse(bot, challenge(value="<script>alert(1)</script>"))
    assert refused.value.status == 400


def test_every_post_is_signed_with_the_app_secret() -> None:
    bot = bot_config()
    payload = update(text_message("hi"))
    whatsapp.verify(bot, signed(payload))
    for bad in (
        signed(payload, secret="not-the-app-secret"),
        WebhookRequest(headers={}, body=signed(payload).body),
        WebhookRequest(headers=signed(payload).headers, body=signed(payload).body + b" "),
        WebhookRequest(headers={"x-hub-signature-256": "sha256=é"}, body=b"{}"),
    ):
        with pytest.raises(WebhookRejected) as refused:
            whatsapp.verify(bot, bad)
        assert (refused.value.status, refused.value.reason) == (401, "bad_signature")


def test_private_text_is_addressed_with_its_window_and_id() -> None:
    payload = update(text_message("hello there"))
    [message] = whatsapp.parse(bot_config(), signed(payload)).messages
    sdk = read_back(payload)
    # The phone number (`wa_id`) where WhatsApp gives one; pywa prefers the business-scoped id.
    assert sdk.chat.type == "PRIVATE" and sdk.from_user.wa_id == ALICE
    assert (message.chat_id, message.chat_type, message.sender.user_id) == (ALICE, "private", ALICE)
    assert message.message_id == message.event_id == sdk.id and message.text == sdk.text == "hello there"
    assert message.sender.name == "Alice" and message.mentions_bot
    assert message.route == {"at_ms": str(int(sdk.timestamp.timestamp()) * 1000), "message_id": sdk.id}


def test_group_message_triggers_on_the_business_number_and_replies_to_it() -> None:
    mention = update(text_message(f"@{BUSINESS_NUMBER} what is new", group=GROUP))
    chatter = update(text_message("just chatting", group=GROUP))
    [addressed] = whatsapp.parse(bot_config(), signed(mention)).messages
    [context] = whatsapp.parse(bot_config(), signed(chatter)).messages
    assert read_back(mention).chat.id == GROUP == addressed.chat_id
    assert addressed.chat_type == "group" and addressed.mentions_bot and addressed.text == "what is new"
    assert not context.mentions_bot
    quoted = wamid()
    reply = update(text_message("and this?", group=GROUP, context={"from": BUSINESS_NUMBER, "id": quoted}))
    [message] = whatsapp.parse(bot_config(), signed(reply)).messages
    assert read_back(reply).reply_to_message is not None
    assert message.reply_to is not None and message.reply_to.message_id == quoted and message.reply_to.is_bot


def test_statuses_never_start_a_turn() -> None:
    status = {
        "id": wamid(),
        "status": "delivered",
        "timestamp": str(int(time.time())),
        "recipient_id": ALICE,
        "recipient_user_id": ALICE_BSUID,
    }
    payload = update(statuses=[status])
    assert MessageStatus.from_update(client=pywa_client(), update=payload).id == status["id"]  # type: ignore[arg-type]
    result = whatsapp.parse(bot_config(), signed(payload))
    assert result.messages == [] and result.ignored == "status"


def test_media_by_id_with_caption_reactions_ignored_and_other_numbers_skipped() -> None:
    image = {
        "from": ALICE,
        "from_user_id": ALICE_BSUID,
        "id": wamid(),
        "timestamp": str(int(time.time())),
        "type": "image",
        "image": {"id": "1479537139650973", "mime_type": "image/jpeg", "sha256": "abc", "caption": "look"},
    }
    payload = update(image)
    assert read_back(payload).image is not None
    [message] = whatsapp.parse(bot_config(), signed(payload)).messages
    assert message.segments[0].model_dump() == {
        "type": "image",
        "data": {"media": {"kind": "file", "value": "1479537139650973"}},
    }
    assert message.text == "[image] look"
    reaction = {**text_message(""), "type": "reaction", "reaction": {"message_id": wamid(), "emoji": "👍"}}
    del reaction["text"]
    assert whatsapp.parse(bot_config(), signed(update(reaction))).ignored == "not_message"
    other = update(text_message("to another number of the app"))
    other["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = "999999999999999"
    assert whatsapp.parse(bot_config(), signed(other)).messages == []


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"106540352242922"},"messages":[{"type":"text"}]}}]}]}',
    ],
)
def test_malformed_webhooks_are_400(body: bytes) -> None:
    with pytest.raises(WebhookRejected) as refused:
        whatsapp.parse(bot_config(), WebhookRequest(headers={}, body=body))
    assert refused.value.status == 400


# -- outbound: a stand-in of the Graph API ----------------------------------------------------------

MESSAGES_PATH = f"/{PHONE_ID}/messages"
MEDIA_PATH = f"/{PHONE_ID}/media"
LOOKASIDE_PATH = "/whatsapp_business/attachments/"  # where Meta's media URLs point (lookaside.fbsbx.com)
_KINDS = {"text", "image", "audio", "video", "document", "reaction"}


def graph_error(code: int, message: str, status: int = 400) -> tuple[int, Any]:
    return status, {"error": {"message": message, "type": "OAuthException", "code": code, "fbtrace_id": "AbCdEf"}}


class WhatsAppStandIn:
    """`/{phone_number_id}/messages` and `/media` as the Cloud API takes them. `received(user,
    message_id, at)` records a user's message: its id may be quoted or reacted to, marked read with
    a typing indicator, and it opens the user's 24-hour window. `sent_by_user(data, mime)` holds
    media a user sent: `GET /{media-id}` answers its lookaside URL, size and SHA-256, and the
    lookaside URL serves the bytes, both only with the bearer token (as Meta's do)."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.last_message_at: dict[str, float] = {}  # user (wa_id) → time of their last message
        self.known_messages: set[str] = set()
        self.media: dict[str, bytes] = {}
        self.user_media: dict[str, tuple[bytes, str]] = {}  # media id → bytes and MIME type
        self._claimed_size: dict[str, int] = {}  # media id → the `file_size` its lookup answers
        # Where media URLs point: the API's own origin unless set (another origin, as Meta's are).
        self.lookaside_base: str | None = None
        self.media_lookups: list[str] = []  # media ids looked up with the token
        self.downloads: list[str] = []  # media ids downloaded with the token
        self.typing: list[str] = []  # message ids marked read with a typing indicator
        self.refused: list[str] = []  # requests refused for want of the token
        self._ids = itertools.count(1)
        api.on(MESSAGES_PATH, self.message)
        api.on(MEDIA_PATH, self.upload)
        api.on(LOOKASIDE_PATH, self.lookaside)

    def sent_by_user(self, data: bytes, mime: str, *, size: int | None = None) -> str:
        """A media id for `data`, as a user's message carries it (`size`: a `file_size` to claim)."""
        media_id = f"{1_400_000_000_000_000 + next(self._ids)}"
        self.user_media[media_id] = (data, mime)
        self._claimed_size[media_id] = len(data) if size is None else size
        self.api.on(f"/{media_id}", self.media_url)
        return media_id

    def _bearer(self, seen: Seen) -> tuple[int, Any] | None:
        if seen.headers.get("authorization") != f"Bearer {ACCESS_TOKEN}":
            self.refused.append(seen.path)
            return graph_error(190, "Invalid OAuth access token - Cannot parse access token", 401)
        return None

    def media_url(self, seen: Seen) -> tuple[int, Any]:
        """`GET /{media-id}`: the media's short-lived URL, with the token only; with
        `phone_number_id`, only for media sent to that number."""
        assert seen.method == "GET", seen.method
        refused = self._bearer(seen)
        if refused:
            return refused
        media_id = seen.path.lstrip("/")
        assert set(seen.query) <= {"phone_number_id"}, seen.query
        if media_id not in self.user_media or seen.query.get("phone_number_id", PHONE_ID) != PHONE_ID:
            return graph_error(100, "Unsupported get request. Object with ID does not exist")
        data, mime = self.user_media[media_id]
        self.media_lookups.append(media_id)
        return 200, {
            "messaging_product": "whatsapp",
            "url": f"{self.lookaside_base or self.api.url}{LOOKASIDE_PATH}?mid={media_id}&ext=1764000000&hash=ATuB3x",
            "mime_type": mime,
            "sha256": hashlib.sha256(data).hexdigest(),
            "file_size": self._claimed_size[media_id],
            "id": media_id,
        }

    def lookaside(self, seen: Seen) -> tuple[int, Any, dict[str, str]]:
        """The media's bytes at its lookaside URL: with the token only (Meta answers 401 without)."""
        assert seen.method == "GET", seen.method
        if seen.headers.get("authorization") != f"Bearer {ACCESS_TOKEN}":
            self.refused.append(seen.path)
            return 401, b"", {}
        media_id = seen.query.get("mid", "")
        if media_id not in self.user_media or not seen.query.get("hash"):
            return 404, b"", {}
        data, mime = self.user_media[media_id]
        self.downloads.append(media_id)
        return 200, data, {"Content-Type": mime}

    def received(self, user: str, message_id: str, at: float | None = None) -> None:
        self.known_messages.add(message_id)
        when = time.time() if at is None else at
        self.last_message_at[user] = max(self.last_message_at.get(user, 0.0), when)

    def _auth(self, seen: Seen) -> tuple[int, Any] | None:
        assert seen.method == "POST"
        return self._bearer(seen)

    def message(self, seen: Seen) -> tuple[int, Any]:
        refused = self._auth(seen)
        if refused:
            return refused
        body = seen.json
        assert isinstance(body, dict) and seen.headers["content-type"].startswith("application/json")
        assert body["messaging_product"] == "whatsapp"
        if "status" in body:
            return self.read(body)
        kind = body["type"]
        assert kind in _KINDS, kind
        assert set(body) <= {"messaging_product", "recipient_type", "to", "recipient", "type", "context", kind}, body
        group = body.get("recipient_type") == "group"
        assert body.get("recipient_type", "individual") in ("individual", "group")
        to = body.get("to") or body.get("recipient")
        assert isinstance(to, str) and to and ("to" in body) != ("recipient" in body)
        if group:
            assert not to.isdigit()  # a group id is not a phone number
        content = body[kind]
        if kind == "text":
            assert set(content) <= {"body", "preview_url"} and 0 < len(content["body"]) <= 4096
        elif kind == "reaction":
            assert set(content) == {"message_id", "emoji"} and content["emoji"]
            if content["message_id"] not in self.known_messages:
                return graph_error(131009, "Parameter value is not valid")
        else:
            assert set(content) <= {"link", "id", "caption", "filename"} and ("link" in content) != ("id" in content)
            if "link" in content:
                assert content["link"].startswith(("https://", "http://"))
            elif content["id"] not in self.media:
                return graph_error(131053, "Media upload error")
        if "context" in body:
            assert set(body["context"]) == {"message_id"}
            if body["context"]["message_id"] not in self.known_messages:
                return graph_error(131009, "Parameter value is not valid")
        if not group and time.time() - self.last_message_at.get(to, 0.0) > 24 * 3600:
            return graph_error(131047, "Re-engagement message")
        return 200, {
            "messaging_product": "whatsapp",
            "contacts": [{"input": to, "wa_id": to}],
            "messages": [{"id": f"wamid.SENT{next(self._ids):010d}"}],
        }

    def read(self, body: dict[str, Any]) -> tuple[int, Any]:
        """A message marked read, with the typing indicator: only a message the user sent."""
        assert set(body) <= {"messaging_product", "status", "message_id", "typing_indicator"}, body
        assert body["status"] == "read" and body.get("typing_indicator", {"type": "text"}) == {"type": "text"}
        if body["message_id"] not in self.known_messages:
            return graph_error(100, "Invalid parameter")
        if "typing_indicator" in body:
            self.typing.append(body["message_id"])
        return 200, {"success": True}

    def upload(self, seen: Seen) -> tuple[int, Any]:
        refused = self._auth(seen)
        if refused:
            return refused
        assert seen.form.get("messaging_product") == "whatsapp" and seen.form.get("type")
        [(field, (_name, data, mime))] = seen.files.items()
        assert field == "file" and data and mime == seen.form["type"]
        media_id = f"{1_500_000_000_000_000 + next(self._ids)}"
        self.media[media_id] = data
        return 200, {"id": media_id}


class _ToStandIn(httpx.BaseTransport):
    """pywa's client speaks to graph.facebook.com: its requests are handed to the stand-in's checks."""

    def __init__(self, standin: WhatsAppStandIn) -> None:
        self.standin = standin

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.url.host == "graph.facebook.com":
            path = "/" + path.split("/", 2)[2]  # without the API version
        content = request.read()
        seen = Seen(
            request.method, path, dict(request.url.params), {k.lower(): v for k, v in request.headers.items()}, content
        )
        seen.json = (
            json.loads(content) if request.headers.get("content-type", "").startswith("application/json") else None
        )
        handler = self.standin.api.defaults[path]
        status, answer, *rest = handler(seen)  # type: ignore[misc]
        if isinstance(answer, bytes):
            return httpx.Response(status, content=answer, headers=rest[0] if rest else {})
        return httpx.Response(status, json=answer)


def outbound(chat: str, segments: list[dict[str, Any]], route: dict[str, str], **extra: Any) -> OutboundMessage:
    group = chat == GROUP
    return OutboundMessage.model_validate(
        {
            "outbound_id": f"out-{next(_n)}",
            "kind": "reply",
            "platform": "whatsapp",
            "bot_id": "wa1",
            "chat_id": chat,
            "chat_type": "group" if group else "private",
            "conversation_key": conversation_key("whatsapp", "wa1", chat),
            "segments": segments,
            "route": route,
            **extra,
        }
    )


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": value}}


def body(call: PlatformCall) -> dict[str, Any]:
    assert call.json is not None
    return call.json


def dead_letters(reason: str) -> float:
    return REGISTRY.get_sample_value("switchboard_dead_letters_total", {"stage": "egress", "reason": reason}) or 0.0


def test_the_standin_takes_what_pywa_sends() -> None:
    api = FakeApi()
    standin = WhatsAppStandIn(api)
    asked = wamid()
    standin.received(ALICE, asked)
    wa = pywa_client(httpx.Client(transport=_ToStandIn(standin)))
    wa.send_message(to=ALICE, text="*hi*", reply_to_message_id=asked)
    wa.send_reaction(to=ALICE, emoji="👍", message_id=asked)
    wa.send_image(to=ALICE, image="https://example.com/a.png")
    wa.send_message(to=GROUP, text="to the group")


def test_render_matches_pywas_requests_for_the_same_content() -> None:
    asked = wamid()
    route = {"message_id": asked, "at_ms": str(int(time.time() * 1000))}
    sent: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        answer = {"messaging_product": "whatsapp", "contacts": [{"input": ALICE, "wa_id": ALICE}]}
        return httpx.Response(200, json={**answer, "messages": [{"id": "wamid.X"}]})

    wa = pywa_client(httpx.Client(transport=httpx.MockTransport(record)))
    wa.send_message(to=ALICE, text="hello", reply_to_message_id=asked)
    wa.send_reaction(to=ALICE, emoji="👍", message_id=asked)
    wa.send_image(to=ALICE, image="https://example.com/a.png")
    segments = [{"type": "reply", "data": {"message_id": asked}}, text("hello")]
    [reply] = whatsapp.render(bot_config(), outbound(ALICE, segments, route))
    [reaction] = whatsapp.render(bot_config(), outbound(ALICE, [{"type": "face", "data": {"id": "👍"}}], route))
    image = {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/a.png"}}}
    [picture] = whatsapp.render(bot_config(), outbound(ALICE, [image], route))
    assert [body(reply), body(reaction), body(picture)] == sent


def test_render_groups_quote_markdown_is_whatsapps_and_long_text_splits() -> None:
    asked = wamid()
    route = {"message_id": asked, "at_ms": str(int(time.time() * 1000))}
    markdown = {"type": "markdown", "data": {"content": "**bold** _it_ ~~gone~~ `x` [site](https://a.example)"}}
    first, *rest = whatsapp.render(bot_config(), outbound(GROUP, [markdown, text(" " + "y" * 4100)], route))
    assert body(first)["recipient_type"] == "group" and body(first)["to"] == GROUP
    assert body(first)["context"] == {"message_id": asked} and rest and not [c for c in rest if "context" in body(c)]
    assert body(first)["text"]["body"].startswith("*bold* _it_ ~gone~ `x` site (https://a.example)")
    assert all(len(body(c)["text"]["body"]) <= 4096 for c in (first, *rest))
    assert sum(body(c)["text"]["body"].count("y") for c in (first, *rest)) == 4100
    # A user known by business-scoped id only is addressed as `recipient`.
    [call] = whatsapp.render(bot_config(), outbound(ALICE_BSUID, [text("hi")], route))
    assert body(call)["recipient"] == ALICE_BSUID and "to" not in body(call)
    # A `kind: file` value not of a media id's shape never reaches WhatsApp.
    segment = {"type": "image", "data": {"media": {"kind": "file", "value": "../../etc/passwd"}}}
    [call] = whatsapp.render(bot_config(), outbound(ALICE, [segment], route))
    assert body(call)["type"] == "text" and body(call)["text"]["body"] == "[attachment unavailable]"


async def test_send_text_reply_and_uploaded_media(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = WhatsAppStandIn(api)
    asked = wamid()
    standin.received(ALICE, asked)
    route = {"message_id": asked, "at_ms": str(int(time.time() * 1000))}
    image = {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}}
    segments = [{"type": "reply", "data": {"message_id": asked}}, text("here"), image]
    calls = whatsapp.render(bot_config(api), outbound(ALICE, segments, route))
    outcomes = [await whatsapp.send(bot_config(api), call, http, load_media) for call in calls]
    assert [o.status for o in outcomes] == ["delivered", "delivered"]
    assert outcomes[0].platform_message_id and outcomes[0].platform_message_id.startswith("wamid.")
    [uploaded] = api.calls(MEDIA_PATH)
    media_id = next(iter(standin.media))
    assert standin.media[media_id] == PNG and uploaded.form["type"] == "image/png"
    assert api.calls(MESSAGES_PATH)[-1].json["image"] == {"id": media_id}
    # Unreadable media: the notice instead, as text.
    [call] = whatsapp.render(bot_config(api), outbound(ALICE, [image], route))
    outcome = await whatsapp.send(bot_config(api), call, http, broken_loader)
    assert (
        outcome.status == "delivered"
        and api.calls(MESSAGES_PATH)[-1].json["text"]["body"] == "[attachment unavailable]"
    )


async def test_past_the_service_window_is_a_named_permanent_failure(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = WhatsAppStandIn(api)
    asked = wamid()
    day_ago = time.time() - 24 * 3600 - 60
    standin.received(ALICE, asked, at=day_ago)
    old = {"message_id": asked, "at_ms": str(int(day_ago * 1000))}
    [call] = whatsapp.render(bot_config(api), outbound(ALICE, [text("late")], old))
    outcome = await whatsapp.send(bot_config(api), call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "outside_service_window") and api.seen == []
    # Without a message to go by (a notice), WhatsApp's own answer says so: the same outcome.
    [call] = whatsapp.render(bot_config(api), outbound(ALICE, [text("late")], {}))
    outcome = await whatsapp.send(bot_config(api), call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "outside_service_window")
    assert "131047" in outcome.detail


async def test_errors_are_classified(api: FakeApi, http: httpx.AsyncClient) -> None:
    [call] = whatsapp.render(bot_config(api), outbound(ALICE, [text("x")], {}))
    cases = [
        (graph_error(130429, "Rate limit hit"), ("retry", "rate_limited")),
        (graph_error(131056, "(Business Account, Consumer Account) pair rate limit hit"), ("retry", "rate_limited")),
        (graph_error(131000, "Something went wrong", 500), ("retry", "server_error")),
        (graph_error(190, "Error validating access token", 401), ("permanent", "unauthorized")),
        (graph_error(131026, "Message undeliverable"), ("permanent", "undeliverable")),
        (graph_error(100, "Invalid parameter"), ("permanent", "bad_request")),
    ]
    for (status, answer), expected in cases:
        api.reply(MESSAGES_PATH, status, answer, once=True)
        outcome = await whatsapp.send(bot_config(api), call, http, load_media)
        assert (outcome.status, outcome.reason) == expected, (answer, outcome)
        if expected[1] == "rate_limited" and answer["error"]["code"] == 131056:
            assert outcome.retry_after == 6.0


# -- inbound media and the typing indicator ----------------------------------------------------------


def test_the_standin_serves_media_and_typing_as_pywa_asks() -> None:
    """pywa's own calls for a media URL, its bytes and the typing indicator are what the stand-in
    takes; without the token it refuses both media requests, as Meta does."""
    api = FakeApi()
    api.url = "https://lookaside.fbsbx.com"  # the host of Meta's media URLs
    standin = WhatsAppStandIn(api)
    media_id = standin.sent_by_user(PNG, "image/png")
    asked = wamid()
    standin.received(ALICE, asked)
    wa = pywa_client(httpx.Client(transport=_ToStandIn(standin)))
    found = wa.get_media_url(media_id)
    assert found.mime_type == "image/png" and found.sha256 == hashlib.sha256(PNG).hexdigest()
    assert wa.get_media_bytes(found.url) == PNG
    assert wa.indicate_typing(asked).success and standin.typing == [asked]
    stranger = WhatsApp(
        phone_id=PHONE_ID, token="EAAG-other", server=None, session=httpx.Client(transport=_ToStandIn(standin))
    )
    with pytest.raises(WhatsAppError):
        stranger.get_media_url(media_id)
    with pytest.raises(httpx.HTTPStatusError):
        stranger.get_media_bytes(found.url)
    assert standin.refused == [f"/{media_id}", LOOKASIDE_PATH]


async def test_typing_marks_the_answered_message_read_as_pywa_does(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = WhatsAppStandIn(api)
    asked = wamid()
    standin.received(ALICE, asked)
    sent: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"success": True})

    pywa_client(httpx.Client(transport=httpx.MockTransport(record))).indicate_typing(asked)
    await whatsapp.typing_on(bot_config(api), ALICE, {"message_id": asked, "at_ms": "1"}, http)
    assert standin.typing == [asked]
    [call] = api.calls(MESSAGES_PATH)
    assert call.json == sent[0] and call.headers["authorization"] == f"Bearer {ACCESS_TOKEN}"
    # A turn answering no particular message (a notice, a held batch's flush without one): nothing.
    await whatsapp.typing_on(bot_config(api), ALICE, {}, http)
    assert len(api.calls(MESSAGES_PATH)) == 1


async def test_inbound_media_is_read_by_id_with_the_token_through_the_guard(
    api: FakeApi, http: httpx.AsyncClient
) -> None:
    """The media id's URL (on another origin, as Meta's lookaside host is) is read with the token
    through the SSRF guard; the production guard refuses it on loopback."""
    standin = WhatsAppStandIn(api)
    standin.lookaside_base = api.url.replace("127.0.0.1", "localhost")
    media_id = standin.sent_by_user(PNG, "image/png")
    media = Media(kind="file", value=media_id)
    async with SafeFetcher(allow_loopback_for_tests=True) as test_guard, SafeFetcher() as production_guard:

        async def guarded(url: str, max_bytes: int, headers: Mapping[str, str]) -> bytes:
            return (await test_guard.fetch(url, max_bytes, headers)).data

        async def strict(url: str, max_bytes: int, headers: Mapping[str, str]) -> bytes:
            return (await production_guard.fetch(url, max_bytes, headers)).data

        assert await whatsapp.fetch_media(bot_config(api), media, http, guarded, 1024) == PNG
        assert standin.media_lookups == [media_id] and standin.downloads == [media_id]
        lookup = api.calls(f"/{media_id}")[0]
        assert lookup.query == {"phone_number_id": PHONE_ID}
        with pytest.raises(MediaUnavailable) as refused:
            await whatsapp.fetch_media(bot_config(api), media, http, strict, 1024)
        assert refused.value.reason == "address_loopback"
        # Larger than allowed: refused on the size the lookup gives, never downloaded.
        with pytest.raises(MediaUnavailable) as refused:
            await whatsapp.fetch_media(bot_config(api), media, http, guarded, len(PNG) - 1)
        assert refused.value.reason == "too_large" and standin.downloads == [media_id]
        # A size claimed small does not let a larger body through: the read stops at the limit.
        understated = standin.sent_by_user(PNG * 100, "image/png", size=10)
        with pytest.raises(MediaUnavailable) as refused:
            await whatsapp.fetch_media(bot_config(api), Media(kind="file", value=understated), http, guarded, 1024)
        assert refused.value.reason == "too_large"
        # A wrong token: WhatsApp's 401, named; an id not of WhatsApp's shape is never looked up.
        wrong = bot_config(api).model_copy(update={"credentials": {**bot_config().credentials}})
        wrong.credentials["access_token"] = SecretStr("EAAG-revoked")
        with pytest.raises(MediaUnavailable) as refused:
            await whatsapp.fetch_media(wrong, media, http, guarded, 1024)
        assert refused.value.reason == "http_401"
        with pytest.raises(MediaUnavailable) as refused:
            await whatsapp.fetch_media(bot_config(api), Media(kind="file", value="../me"), http, guarded, 1024)
        assert refused.value.reason == "file_id_shape"
    # On the API's own origin (a stand-in, or a proxy the operator set as api_base): read directly.
    standin.lookaside_base = None
    assert await whatsapp.fetch_media(bot_config(api), media, http, guarded, 1024) == PNG


def test_settings_require_the_four_credentials() -> None:
    from pipeline.platforms.checks import bot_problems

    problems = bot_problems([{"platform": "whatsapp", "bot_id": "w", "credentials": {"access_token": "t"}}])
    assert sorted(p.loc[-1] for p in problems) == ["app_secret", "phone_number_id", "verify_token"]


# -- fuzzed: one field of a valid webhook replaced by any JSON value: parsed or a 400, never a crash ---


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), new=fuzz.json_values)
def test_fuzzed_webhooks_parse_or_are_refused(data: st.DataObject, new: Any) -> None:
    image = {
        "from": ALICE,
        "id": "wamid.IMG",
        "timestamp": "1796000000",
        "type": "image",
        "image": {"id": "1479537139650973", "caption": "c"},
        "context": {"from": BUSINESS_NUMBER, "id": "wamid.Q"},
    }
    fixture = update(text_message(f"@{BUSINESS_NUMBER} hi", group=GROUP), image)
    fixture["entry"][0]["changes"][0]["value"]["statuses"] = [{"id": "wamid.S", "status": "read"}]
    path = data.draw(st.sampled_from(fuzz._paths(fixture)))  # noqa: SLF001
    body = json.dumps(fuzz._replace(fixture, path, new)).encode()
    try:
        result = whatsapp.parse(bot_config(), WebhookRequest(headers={}, body=body))
    except WebhookRejected as exc:
        assert exc.status == 400 and exc.reason in fuzz.REASONS
        return
    assert result.ignored in fuzz.IGNORED | {"status"}
    for message in result.messages:
        message.model_dump_json()
