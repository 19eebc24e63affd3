"""LINE and the WhatsApp Cloud API end to end: a signed webhook in, through the real worker, broker
and Redis, the reply out to a stand-in of the platform's API.

One stack for the module (a fresh broker, the session's Redis under a unique prefix, the simulator,
one worker) with the bots' `api_base` pointing at the stand-ins of `tests/platforms/test_line.py`
and `test_whatsapp.py`, served from a background thread so the worker's processes can call them
while each test, on its own loop, reads what they received. Inbound webhooks are built with the
platforms' SDKs (line-bot-sdk's webhook models; pywa reads back every WhatsApp payload) and signed
as the platforms sign them. The simulator's agent echoes: a message `T` is answered `echo: T`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
from linebot.v3.webhooks import DeliveryContext, GroupSource, UserMentionee
from prometheus_client.parser import text_string_to_metric_families

from pipeline.bench.measure import TLS
from pipeline.embedded import RedisServer
from pipeline.kafka import ConsumeTimeoutError, consume_until
from pipeline.platforms import WebhookRequest
from pipeline.platforms.line import PUSH_PATH, REPLY_PATH
from pipeline.segments.notices import DEFAULT_NOTICES, NoticeKind
from pipeline.stack import Stack
from pipeline.topics import DEADLETTER, IM_INBOUND
from tests.conftest import enabled_brokers
from tests.platforms import test_line as line_fx
from tests.platforms import test_whatsapp as wa_fx
from tests.platforms.conftest import FakeApi, Seen

from .stacks import running_stack, stack_idle

pytestmark = [pytest.mark.integration]

LINE_BOT = "ln1"
LINE_PUSH_BOT = "ln2"  # the same channel with active_messages = true
LINE_NOTICE_LEAD = 5  # reply_window_notice_seconds of both LINE bots (30 by default), for a short test
WHATSAPP_BOT = "wa1"


class StandIns:
    """The platforms' API stand-ins on a loop of their own. A request a stand-in refuses with an
    exception (a check the real platform makes) is kept in `errors` and answered 400."""

    def __init__(self) -> None:
        self.apis = {"line": FakeApi(), "whatsapp": FakeApi()}
        self.errors: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="line-whatsapp-standins", daemon=True)

    def start(self) -> StandIns:
        self._thread.start()
        for api in self.apis.values():
            self._run(api.start())
        self.line = line_fx.LineStandIn(self.apis["line"])
        self.whatsapp = wa_fx.WhatsAppStandIn(self.apis["whatsapp"])
        for api in self.apis.values():
            for path, handler in list(api.defaults.items()):
                api.defaults[path] = self.checked(handler)
        return self

    def stop(self) -> None:
        try:
            for api in self.apis.values():
                self._run(api.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=15)

    def checked(self, handler: Callable[[Seen], Any]) -> Callable[[Seen], Any]:
        def handle(seen: Seen) -> Any:
            try:
                return handler(seen)
            except Exception as exc:  # a request the real platform would refuse
                self.errors.append(f"{seen.path}: {exc!r} body={seen.body[:500]!r}")
                return 400, {"message": "stand-in check failed"}

        return handle

    def url(self, platform: str) -> str:
        return self.apis[platform].url

    def calls(self, platform: str, *paths: str) -> list[Seen]:
        return [s for s in list(self.apis[platform].seen) if not paths or s.path in paths]

    async def wait_for(self, found: Callable[[], list[Any]], count: int = 1, within: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + within
        while True:
            got = found()
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(got)} of {count} calls after {within}s; errors: {self.errors}")
            await asyncio.sleep(0.05)


def _bots_toml(standins: StandIns) -> str:
    line_credentials = (
        f'{{ channel_secret = "{line_fx.CHANNEL_SECRET}", channel_access_token = "{line_fx.ACCESS_TOKEN}" }}'
    )
    out = []
    for bot_id, extra in ((LINE_BOT, ""), (LINE_PUSH_BOT, "active_messages = true\n")):
        out.append(
            f'[[bots]]\nplatform = "line"\nbot_id = "{bot_id}"\nself_id = "{line_fx.BOT_USER}"\n'
            f'api_base = "{standins.url("line")}"\nlanguage = "en"\n{extra}'
            f"reply_window_notice_seconds = {LINE_NOTICE_LEAD}\ncredentials = {line_credentials}\n"
        )
    wa_credentials = ", ".join(
        f"{k} = {json.dumps(v.get_secret_value())}" for k, v in wa_fx.bot_config().credentials.items()
    )
    out.append(
        f'[[bots]]\nplatform = "whatsapp"\nbot_id = "{WHATSAPP_BOT}"\nself_id = "{wa_fx.BUSINESS_NUMBER}"\n'
        f'api_base = "{standins.url("whatsapp")}"\nlanguage = "en"\ncredentials = {{ {wa_credentials} }}\n'
    )
    return "\n".join(out)


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def standins(broker_kind: str) -> Iterator[StandIns]:
    servers = StandIns().start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, standins: StandIns) -> Iterator[Stack]:
    with running_stack(broker_kind, name="e2e-lw", bots_toml=_bots_toml(standins), redis_url=redis_server.url) as stack:
        yield stack


@pytest.fixture(autouse=True)
def _standins_saw_only_valid_requests(standins: StandIns) -> Iterator[None]:
    yield
    assert standins.errors == [], "requests the real platform would refuse"


async def post(stack: Stack, platform: str, bot_id: str, request: WebhookRequest) -> httpx.Response:
    url = f"{stack.workers[0].url}/webhooks/{platform}/{bot_id}"
    async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
        return await client.post(url, content=request.body, headers=dict(request.headers))


async def metrics_text(stack: Stack) -> str:
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        return (await client.get(f"{stack.workers[0].url}/metrics")).text


def counted(text: str, family_name: str, sample_name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == family_name
        for sample in family.samples
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def inbound_texts_until(stack: Stack, sentinels: list[str]) -> list[str]:
    """Every `im.inbound` record's text, read until each sentinel text was seen."""
    missing = set(sentinels)

    def found(record: Any) -> bool:
        text = json.loads(record.value).get("text", "")
        for sentinel in list(missing):
            if sentinel in text:
                missing.discard(sentinel)
        return not missing

    records = await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], IM_INBOUND, found, timeout=30)
    return [json.loads(r.value).get("text", "") for r in records]


async def egress_dead_letters(stack: Stack, chat: str, *, timeout: float = 45) -> list[dict[str, Any]]:
    letters: list[dict[str, Any]] = []

    def dead(record: Any) -> bool:
        letter = json.loads(record.value)
        if letter["stage"] == "egress" and json.loads(letter["record"])["chat_id"] == chat:
            letters.append(letter)
        return bool(letters)

    await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, dead, timeout=timeout)
    return letters


def _line_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


# -- LINE --------------------------------------------------------------------------------------------


def line_sent_to(standins: StandIns, token_or_chat: str) -> list[Seen]:
    """Reply calls with this reply token, or push calls to this chat, LINE accepted."""
    return [
        s
        for s in standins.calls("line", REPLY_PATH, PUSH_PATH)
        if (s.json or {}).get("replyToken") == token_or_chat or (s.json or {}).get("to") == token_or_chat
    ]


def line_text(seen: Seen) -> str:
    return "".join(m.get("text", "") for m in seen.json["messages"])


async def test_line_group_mention_and_private_each_delivered_twice_answered_once(
    stack: Stack, standins: StandIns
) -> None:
    group, alice, bob = _line_id("C"), _line_id("U"), _line_id("U")
    mention = line_fx.group_mention("what time is it line", group=group, user=alice)
    private = line_fx.private_text("hello line privately", user=bob)
    context = line_fx.text_event("just chatting in line", source=GroupSource(group_id=group, user_id=bob))
    for event in (mention, private, context):
        standins.line.received(event.reply_token)
    # One webhook with all three, then LINE's redelivery of it (the same webhookEventIds).
    redelivered = [e.copy(update={"delivery_context": DeliveryContext(is_redelivery=True)}) for e in (mention, private)]
    for request in (line_fx.signed(mention, private, context), line_fx.signed(*redelivered)):
        response = await post(stack, "line", LINE_BOT, request)
        assert response.status_code == 200, response.text

    await standins.wait_for(lambda: line_sent_to(standins, mention.reply_token))
    await standins.wait_for(lambda: line_sent_to(standins, private.reply_token))
    await stack_idle(stack)
    [group_reply] = line_sent_to(standins, mention.reply_token)
    [private_reply] = line_sent_to(standins, private.reply_token)
    assert group_reply.path == private_reply.path == REPLY_PATH
    # The agent echoes; in a group it sees who spoke, `[name (id)] text`.
    assert line_text(group_reply).startswith("echo: ") and line_text(group_reply).endswith(" what time is it line")
    # The group's answer quotes the message it answers; the SDK built that quote token.
    assert group_reply.json["messages"][0]["quoteToken"] == mention.message.quote_token
    assert "quoteToken" not in private_reply.json["messages"][0]
    assert line_text(private_reply) == "echo: hello line privately"
    # The message that did not mention the bot is context: nothing answered it, no push went anywhere.
    assert not line_sent_to(standins, context.reply_token) and not standins.calls("line", PUSH_PATH)
    # The one-to-one chat showed the loading animation while its turn ran; the group did not.
    assert bob in standins.line.loading and group not in standins.line.loading


async def test_line_forged_signature_is_refused_and_produces_nothing(stack: Stack, standins: StandIns) -> None:
    user = _line_id("U")
    event = line_fx.private_text("forged line", user=user)
    forged = line_fx.signed(event, secret="not-the-channel-secret-at-all")
    before = counted(await metrics_text(stack), "switchboard_webhooks", "switchboard_webhooks_total", platform="line")
    response = await post(stack, "line", LINE_BOT, forged)
    assert response.status_code == 401 and response.json() == {"error": "bad_signature"}

    # The genuine message with the same ids after it: had the forged one got in, this were a duplicate.
    genuine = event.copy(update={"message": event.message.copy(update={"text": "genuine line"})})
    standins.line.received(genuine.reply_token)
    assert (await post(stack, "line", LINE_BOT, line_fx.signed(genuine))).status_code == 200
    texts = await inbound_texts_until(stack, ["genuine line"])
    assert not [t for t in texts if "forged line" in t], texts
    [reply] = await standins.wait_for(lambda: line_sent_to(standins, genuine.reply_token))
    assert line_text(reply) == "echo: genuine line"
    try:  # a 401 is no malformed payload: no dead letter either
        await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, lambda _r: False, timeout=2)
    except ConsumeTimeoutError as exc:
        assert not [r for r in exc.records if b"forged line" in r.value]
    await stack_idle(stack)
    assert not [s for s in standins.calls("line") if b"forged" in s.body]
    metrics = await metrics_text(stack)
    assert 'switchboard_webhooks_total{outcome="bad_signature",platform="line"} 1.0' in metrics
    assert counted(metrics, "switchboard_webhooks", "switchboard_webhooks_total", platform="line") > before


async def test_line_a_turn_outliving_the_reply_token_gets_the_notice_then_a_push_or_a_named_dead_letter(
    stack: Stack, standins: StandIns
) -> None:
    """Two group messages reaching the bot 38 s after they were sent: their reply tokens are used
    until 50 s (LINE's minute, less a margin), and the notice is due 5 s before that. The agent
    thinks 15 s, so the notice takes the reply token; the answer then goes as a push for the bot
    that allows pushes, and is dead-lettered `reply_token_expired` for the one that does not."""
    sent_ms = int((time.time() - 38) * 1000)
    events = {}
    for bot_id in (LINE_BOT, LINE_PUSH_BOT):
        group = _line_id("C")
        mention = UserMentionee(index=0, length=len("@Switchboard"), user_id=line_fx.BOT_USER, is_self=True)
        event = line_fx.text_event(
            f"@Switchboard slow {bot_id} [sim:think=15]",
            source=GroupSource(group_id=group, user_id=_line_id("U")),
            mentionees=[mention],
            timestamp_ms=sent_ms,
        )
        standins.line.received(event.reply_token, at=sent_ms / 1000)
        events[bot_id] = (event, group)
        assert (await post(stack, "line", bot_id, line_fx.signed(event))).status_code == 200

    quiet_event, quiet_group = events[LINE_BOT]
    [letter] = await egress_dead_letters(stack, quiet_group, timeout=60)
    assert letter["reason"] == "reply_token_expired", letter
    assert json.loads(letter["record"])["segments"][0]["data"]["text"].endswith(f"slow {LINE_BOT}")
    push_event, push_group = events[LINE_PUSH_BOT]
    await standins.wait_for(lambda: line_sent_to(standins, push_group))
    await stack_idle(stack)

    [notice] = line_sent_to(standins, quiet_event.reply_token)
    assert line_text(notice) == DEFAULT_NOTICES["en"][NoticeKind.REPLY_WINDOW_CLOSING]
    assert not line_sent_to(standins, quiet_group)  # no push for the bot without pushes
    [notice] = line_sent_to(standins, push_event.reply_token)
    assert line_text(notice) == DEFAULT_NOTICES["en"][NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE]
    [push] = line_sent_to(standins, push_group)
    assert push.path == PUSH_PATH and line_text(push).endswith(f"slow {LINE_PUSH_BOT}")
    assert uuid.UUID(push.headers["x-line-retry-key"])
    metrics = await metrics_text(stack)
    assert (
        counted(metrics, "switchboard_notices", "switchboard_notices_total", platform="line", notice="push_fallback")
        == 1
    )
    assert (
        counted(metrics, "switchboard_dead_letters", "switchboard_dead_letters_total", reason="reply_token_expired")
        == 1
    )


# -- WhatsApp ----------------------------------------------------------------------------------------


def wa_sent_to(standins: StandIns, chat: str) -> list[Seen]:
    """Message calls to `chat` (a user's number or a group id) the Graph API stand-in received."""
    return [s for s in standins.calls("whatsapp", wa_fx.MESSAGES_PATH) if (s.json or {}).get("to") == chat]


def wa_text(seen: Seen) -> str:
    return str(seen.json.get("text", {}).get("body", ""))


def _wa_user() -> str:
    return str(16_000_000_000 + uuid.uuid4().int % 1_000_000_000)


def _wa_group() -> str:
    return "Y2FwaV9ncm91cD" + uuid.uuid4().hex


async def test_whatsapp_subscription_check_through_the_worker(stack: Stack) -> None:
    url = f"{stack.workers[0].url}/webhooks/whatsapp/{WHATSAPP_BOT}"
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        good = await client.get(url, params=wa_fx.challenge(value="84230195").query)
        bad = await client.get(url, params=wa_fx.challenge(token="a-guess", value="84230195").query)
    assert good.status_code == 200 and good.text == "84230195"
    assert bad.status_code == 401 and "84230195" not in bad.text


async def test_whatsapp_group_mention_and_private_each_delivered_twice_answered_once(
    stack: Stack, standins: StandIns
) -> None:
    group, alice, bob = _wa_group(), _wa_user(), _wa_user()
    mention = wa_fx.text_message(f"@{wa_fx.BUSINESS_NUMBER} what time is it whatsapp", user=alice, group=group)
    chatter = wa_fx.text_message("just chatting on whatsapp", user=bob, group=group)
    private = wa_fx.text_message("hello whatsapp privately", user=bob)
    for user, message in ((alice, mention), (bob, chatter), (bob, private)):
        standins.whatsapp.received(user, message["id"])
    payloads = [wa_fx.update(mention, user=alice), wa_fx.update(chatter, user=bob), wa_fx.update(private, user=bob)]
    for payload in payloads:
        assert wa_fx.read_back(payload).id  # pywa reads what WhatsApp would send
    # A delivery status of an earlier answer: never a turn.
    status = {"id": "wamid.STATUS1", "status": "read", "timestamp": str(int(time.time())), "recipient_id": bob}
    statuses = wa_fx.update(statuses=[status], user=bob)
    before = counted(await metrics_text(stack), "switchboard_webhooks", "switchboard_webhooks_total", outcome="status")
    # Each webhook twice: WhatsApp posts again what it got no 200 for, signed anew.
    for payload in [*payloads, statuses, *payloads]:
        response = await post(stack, "whatsapp", WHATSAPP_BOT, wa_fx.signed(payload))
        assert response.status_code == 200, response.text

    await standins.wait_for(lambda: wa_sent_to(standins, group))
    await standins.wait_for(lambda: wa_sent_to(standins, bob))
    await stack_idle(stack)
    [group_reply] = wa_sent_to(standins, group)
    [private_reply] = wa_sent_to(standins, bob)
    assert group_reply.json["recipient_type"] == "group"
    assert group_reply.json["context"] == {"message_id": mention["id"]}  # which message it answers
    assert wa_text(group_reply).startswith("echo: ") and wa_text(group_reply).endswith(" what time is it whatsapp")
    assert private_reply.json["recipient_type"] == "individual" and "context" not in private_reply.json
    assert wa_text(private_reply) == "echo: hello whatsapp privately"
    assert not wa_sent_to(standins, alice)  # nothing went to the group's members one by one
    after = counted(await metrics_text(stack), "switchboard_webhooks", "switchboard_webhooks_total", outcome="status")
    assert after == before + 1


async def test_whatsapp_forged_signature_is_refused_and_produces_nothing(stack: Stack, standins: StandIns) -> None:
    user = _wa_user()
    message = wa_fx.text_message("forged whatsapp", user=user)
    response = await post(stack, "whatsapp", WHATSAPP_BOT, wa_fx.signed(wa_fx.update(message, user=user), secret="x"))
    assert response.status_code == 401 and response.json() == {"error": "bad_signature"}

    genuine = {**message, "text": {"body": "genuine whatsapp"}}  # the same wamid after it
    standins.whatsapp.received(user, genuine["id"])
    assert (
        await post(stack, "whatsapp", WHATSAPP_BOT, wa_fx.signed(wa_fx.update(genuine, user=user)))
    ).status_code == 200
    texts = await inbound_texts_until(stack, ["genuine whatsapp"])
    assert not [t for t in texts if "forged whatsapp" in t], texts
    [reply] = await standins.wait_for(lambda: wa_sent_to(standins, user))
    assert wa_text(reply) == "echo: genuine whatsapp"
    await stack_idle(stack)
    assert len(wa_sent_to(standins, user)) == 1
    metrics = await metrics_text(stack)
    assert 'switchboard_webhooks_total{outcome="bad_signature",platform="whatsapp"} 1.0' in metrics


async def test_whatsapp_an_answer_past_the_service_window_is_a_named_dead_letter(
    stack: Stack, standins: StandIns
) -> None:
    """A message WhatsApp delivers a day late (its `timestamp`): the window it opened has closed, so
    the answer is dead-lettered `outside_service_window` and counted, without a call WhatsApp would
    refuse (131047)."""
    user = _wa_user()
    sent = time.time() - 24 * 3600 - 120
    message = wa_fx.text_message("a day late whatsapp", user=user, sent=sent)
    standins.whatsapp.received(user, message["id"], at=sent)
    before = counted(
        await metrics_text(stack),
        "switchboard_dead_letters",
        "switchboard_dead_letters_total",
        reason="outside_service_window",
    )
    assert (
        await post(stack, "whatsapp", WHATSAPP_BOT, wa_fx.signed(wa_fx.update(message, user=user)))
    ).status_code == 200
    [letter] = await egress_dead_letters(stack, user)
    assert letter["reason"] == "outside_service_window" and "approved template" in letter["error"]
    await stack_idle(stack)
    assert wa_sent_to(standins, user) == []
    after = counted(
        await metrics_text(stack),
        "switchboard_dead_letters",
        "switchboard_dead_letters_total",
        reason="outside_service_window",
    )
    assert after == before + 1


def _wa_image(user: str, media_id: str, caption: str) -> dict[str, Any]:
    """An image message as the webhook carries it: the media id, its type, digest and caption."""
    message = wa_fx.text_message("", user=user)
    del message["text"]
    digest = hashlib.sha256(wa_fx.PNG).hexdigest()
    image = {"id": media_id, "mime_type": "image/png", "sha256": digest, "caption": caption}
    return {**message, "type": "image", "image": image}


def _user_media(standins: StandIns, data: bytes, mime: str, **extra: Any) -> str:
    """A media id the stand-in serves, its lookup checked like every other request."""
    media_id = standins.whatsapp.sent_by_user(data, mime, **extra)
    api = standins.apis["whatsapp"]
    api.defaults[f"/{media_id}"] = standins.checked(api.defaults[f"/{media_id}"])
    return media_id


async def test_whatsapp_an_inbound_image_reaches_the_session_and_the_user_sees_typing(
    stack: Stack, standins: StandIns
) -> None:
    """An image by media id: the worker looks it up and downloads it with the token, the session
    gets its bytes (the simulator's `[sim:media]` echo names their type and digest), and the
    message is marked read with the typing indicator while the turn runs. An image WhatsApp says
    is too large is not downloaded: the session reads why, and the caption still gets its answer."""
    user, other = _wa_user(), _wa_user()
    media_id = _user_media(standins, wa_fx.PNG, "image/png")
    image = _wa_image(user, media_id, "what is this [sim:media]")
    huge_id = _user_media(standins, wa_fx.PNG, "image/png", size=6 * 1024 * 1024)
    huge = _wa_image(other, huge_id, "and this one [sim:media]")
    for sender, message in ((user, image), (other, huge)):
        standins.whatsapp.received(sender, message["id"])
        payload = wa_fx.update(message, user=sender)
        assert wa_fx.read_back(payload).image is not None
        assert (await post(stack, "whatsapp", WHATSAPP_BOT, wa_fx.signed(payload))).status_code == 200

    [reply] = await standins.wait_for(lambda: wa_sent_to(standins, user))
    digest = hashlib.sha256(wa_fx.PNG).hexdigest()[:16]
    assert wa_text(reply) == f"echo: what is this | image image/png sha256:{digest}"
    [refused] = await standins.wait_for(lambda: wa_sent_to(standins, other))
    assert wa_text(refused).split() == (
        "echo: and this one [the image sent with this message could not be read: too_large] | no media".split()
    )
    await stack_idle(stack)
    assert standins.whatsapp.downloads.count(media_id) == 1 and huge_id not in standins.whatsapp.downloads
    assert {image["id"], huge["id"]} <= set(standins.whatsapp.typing)
    typing = [s for s in standins.calls("whatsapp", wa_fx.MESSAGES_PATH) if (s.json or {}).get("status") == "read"]
    assert {s.json["message_id"] for s in typing} >= {image["id"], huge["id"]}
