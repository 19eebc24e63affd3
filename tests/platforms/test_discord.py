"""Discord: Gateway `MESSAGE_CREATE` payloads as documented and interactions signed with PyNaCl;
outbound against a local stand-in of the REST API that checks what Discord checks (the bot token,
the path, `content` of at most 2,000 characters, `allowed_mentions` on every message, the multipart
shape of an upload) and answers with rate-limit headers, 429s and Discord's JSON errors. The
expected `allowed_mentions` and intents are built with discord.py's own models."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import discord
import httpx
import pytest
from nacl.signing import SigningKey

from pipeline.errors import ConfigurationError
from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.checks import check_bots
from pipeline.platforms.discord import DiscordPlatform, escape_markdown
from pipeline.records import OutboundMessage
from pipeline.runtime import deployment_secrets
from pipeline.segments import segment_list_adapter
from pipeline.settings import BotConfig, Settings

from .conftest import PNG, PNG_B64, Answer, FakeApi, Seen, broken_loader, load_media

TOKEN = "MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs"
BOT_USER = "1100000000000000001"
ALICE = "2200000000000000002"
BOB = "3300000000000000003"
GUILD = "4400000000000000004"
CHANNEL = "5500000000000000005"
DM_CHANNEL = "6600000000000000006"
SIGNING_KEY = SigningKey(bytes(range(32)))
PUBLIC_KEY = SIGNING_KEY.verify_key.encode().hex()
MESSAGE_PATH = re.compile(r"/channels/(\d{17,20})/messages")
WEBHOOK_PATH = re.compile(r"/webhooks/(\d{17,20})/([\w.-]+)(/messages/@original)?")


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="discord",
        bot_id="dc1",
        self_id=BOT_USER,
        credentials={"token": TOKEN, "public_key": PUBLIC_KEY},
        api_base=api.url if api else None,
        **extra,
    )


def dispatch(d: dict[str, Any], seq: int = 5) -> bytes:
    return json.dumps({"op": 0, "t": "MESSAGE_CREATE", "s": seq, "d": d}).encode()


def user(uid: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"id": uid, "username": name, "global_name": name.title(), "discriminator": "0", "avatar": None, **extra}


def message_create(content: str, *, guild: bool = True, **extra: Any) -> dict[str, Any]:
    """A MESSAGE_CREATE `d` as the Gateway documentation shows it."""
    d: dict[str, Any] = {
        "id": "7700000000000000007",
        "channel_id": CHANNEL if guild else DM_CHANNEL,
        "author": user(ALICE, "alice"),
        "content": content,
        "timestamp": "2026-11-30T12:00:00.000000+00:00",
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": False,
        "mentions": [],
        "mention_roles": [],
        "attachments": [],
        "embeds": [],
        "pinned": False,
        "type": 0,
    }
    if guild:
        d["guild_id"] = GUILD
        d["member"] = {"nick": "Ally", "roles": []}
    d.update(extra)
    return d


def parse(body: bytes) -> Any:
    return get_platform("discord").parse(bot_config(), WebhookRequest(headers={}, body=body))


# --- in: the Gateway ----------------------------------------------------------------------------


def test_guild_mention_of_the_bot() -> None:
    d = message_create(f"<@{BOT_USER}> hi <@!{BOB}> in <#{CHANNEL}> <:party:123456> <@&999>")
    d["mentions"] = [user(BOT_USER, "switchboard", bot=True), user(BOB, "bob")]
    [m] = parse(dispatch(d)).messages
    assert (m.chat_id, m.chat_type, m.sender.user_id, m.sender.name) == (CHANNEL, "group", ALICE, "Ally")
    assert m.mentions_bot and m.mentions == [BOT_USER, BOB]
    assert m.mention_names == {BOT_USER: "Switchboard", BOB: "Bob"}
    assert m.text == f"@Switchboard hi @Bob in #channel:{CHANNEL} :party: @role:999"
    assert m.route == {"guild_id": GUILD}
    assert m.sent_at_ms == pytest.approx(1796040000000.0)


def test_guild_message_without_mention_is_context_and_dm_is_private() -> None:
    [group] = parse(dispatch(message_create("just chatting"))).messages
    assert not group.mentions_bot and group.chat_type == "group"
    [dm] = parse(dispatch(message_create("hello", guild=False))).messages
    assert dm.chat_type == "private" and dm.chat_id == DM_CHANNEL and dm.route == {}


def test_reply_to_the_bot_and_attachments() -> None:
    d = message_create(
        "look",
        type=19,
        message_reference={"message_id": "8800000000000000008", "channel_id": CHANNEL, "guild_id": GUILD},
        referenced_message={"id": "8800000000000000008", "author": user(BOT_USER, "sb", bot=True), "content": "q?"},
        attachments=[
            {"id": "1", "filename": "a.png", "content_type": "image/png", "url": "https://cdn.discordapp.com/a.png"},
            {"id": "2", "filename": "r.pdf", "content_type": "application/pdf", "url": "https://cdn.discordapp.com/r"},
        ],
    )
    [m] = parse(dispatch(d)).messages
    assert m.mentions_bot and m.reply_to is not None and m.reply_to.is_bot and m.reply_to.text == "q?"
    assert [s.type for s in m.segments] == ["reply", "text", "image", "file"]
    assert m.text == "look[image][file]"


@pytest.mark.parametrize(
    ("d", "ignored"),
    [
        (message_create("me", author=user(BOT_USER, "sb", bot=True)), "own_message"),
        (message_create("other bot", author=user(BOB, "b", bot=True)), "bot_or_subtype"),
        (message_create("webhook", webhook_id="1"), "bot_or_subtype"),
        (message_create("", type=7), "not_message"),  # a member joined
    ],
)
def test_ignored_messages(d: dict[str, Any], ignored: str) -> None:
    result = parse(dispatch(d))
    assert result.messages == [] and result.ignored == ignored


def test_other_dispatches_and_malformed_frames() -> None:
    assert parse(json.dumps({"op": 0, "t": "GUILD_CREATE", "s": 2, "d": {}}).encode()).ignored == "not_message"
    for body in (b"[1]", b"{", dispatch({"id": "1"}), json.dumps({"op": 0, "t": "MESSAGE_CREATE"}).encode()):
        with pytest.raises(WebhookRejected) as info:
            parse(body)
        assert info.value.status == 400


# --- in: interactions ----------------------------------------------------------------------------


def signed(payload: dict[str, Any], *, ts: int | None = None, key: SigningKey = SIGNING_KEY) -> WebhookRequest:
    body = json.dumps(payload).encode()
    timestamp = str(ts if ts is not None else int(time.time()))
    signature = key.sign(timestamp.encode() + body).signature.hex()
    headers = {"x-signature-ed25519": signature, "x-signature-timestamp": timestamp}
    return WebhookRequest(headers=headers, body=body, received_at_ms=time.time() * 1000)


SLASH = {
    "id": "9900000000000000009",
    "application_id": BOT_USER,
    "type": 2,
    "token": "aW50ZXJhY3Rpb246OTk5OmZha2V0b2tlbg",
    "version": 1,
    "guild_id": GUILD,
    "channel_id": CHANNEL,
    "member": {"user": user(ALICE, "alice"), "nick": None, "roles": []},
    "data": {
        "id": "1",
        "name": "ask",
        "type": 1,
        "options": [{"name": "question", "type": 3, "value": "what is 2+2?"}],
    },
}


def test_ping_is_answered_with_pong() -> None:
    platform, bot = get_platform("discord"), bot_config()
    request = signed({"type": 1, "id": "1", "application_id": BOT_USER, "token": "t", "version": 1})
    platform.verify(bot, request)
    result = platform.parse(bot, request)
    assert result.body == {"type": 1} and result.messages == []


def test_slash_command_is_deferred_and_becomes_a_message() -> None:
    platform, bot = get_platform("discord"), bot_config()
    request = signed(SLASH)
    platform.verify(bot, request)
    result = platform.parse(bot, request)
    assert result.body == {"type": 5}
    [m] = result.messages
    assert m.text == "/ask question=what is 2+2?" and m.mentions_bot and m.chat_id == CHANNEL
    assert m.route == {"interaction_token": SLASH["token"], "application_id": BOT_USER, "guild_id": GUILD}


def test_bad_signatures_and_stale_timestamps_are_refused() -> None:
    platform, bot = get_platform("discord"), bot_config()
    cases = [
        signed(SLASH, key=SigningKey(bytes(32))),  # another key
        signed(SLASH, ts=int(time.time()) - 3600),  # a recording
        WebhookRequest(headers={"x-signature-ed25519": "zz", "x-signature-timestamp": "1"}, body=b"{}"),
        WebhookRequest(headers={}, body=b"{}"),
    ]
    tampered = signed(SLASH)
    cases.append(WebhookRequest(headers=tampered.headers, body=tampered.body.replace(b"2+2", b"2+3")))
    for request in cases:
        with pytest.raises(WebhookRejected) as info:
            platform.verify(bot, request)
        assert info.value.status == 401
    no_key = BotConfig(platform="discord", bot_id="dc1", self_id=BOT_USER, credentials={"token": TOKEN})
    with pytest.raises(WebhookRejected):
        platform.verify(no_key, signed(SLASH))


def test_self_id_is_required() -> None:
    platform = get_platform("discord")
    assert platform.settings_problems({"platform": "discord"}) == [
        ("self_id", "required for Discord: the bot's user id (its application id), digits")
    ]
    assert platform.settings_problems({"self_id": BOT_USER}) == []


# --- out -----------------------------------------------------------------------------------------


def check_discord(seen: Seen) -> Answer:
    """What Discord's REST API refuses, refused the way it does."""
    if seen.headers.get("authorization") != f"Bot {TOKEN}" and not seen.path.startswith("/webhooks/"):
        return 401, {"message": "401: Unauthorized", "code": 0}
    if seen.files or seen.form:  # an upload: `payload_json` and `files[n]`, nothing else
        assert set(seen.form) == {"payload_json"} and set(seen.files) == {"files[0]"}
        body = json.loads(seen.form["payload_json"])
        assert body["attachments"] == [{"id": 0, "filename": seen.files["files[0]"][0]}]
        assert seen.files["files[0]"][1]
    else:
        body = seen.json
    assert MESSAGE_PATH.fullmatch(seen.path) or WEBHOOK_PATH.fullmatch(seen.path), seen.path
    assert seen.method == ("PATCH" if seen.path.endswith("@original") else "POST")
    # Every message says whom it may ping, and it is never @everyone, @here or a role.
    mentions = body["allowed_mentions"]
    assert mentions["parse"] == [] and "roles" not in mentions and not mentions.get("replied_user")
    assert all(re.fullmatch(r"\d{17,20}", u) for u in mentions["users"]) and len(mentions["users"]) <= 100
    content = body.get("content", "")
    assert len(content) <= 2000
    if not seen.files:
        assert content.strip(), "empty message (50006)"
    if MESSAGE_PATH.fullmatch(seen.path):  # a nonce per message, enforced: repeats are posted once
        assert isinstance(body["nonce"], str) and 0 < len(body["nonce"]) <= 25 and body["enforce_nonce"] is True
    if "message_reference" in body:
        assert set(body["message_reference"]) == {"message_id", "fail_if_not_exists"}
    headers = {"X-RateLimit-Bucket": "abcd1234", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset-After": "5"}
    return 200, {"id": f"1{len(seen.body) + len(content):018d}", "channel_id": CHANNEL, "content": content}, headers


def outbound(
    segments: list[dict[str, Any]], chat: str = CHANNEL, outbound_id: str = "out-d", **extra: Any
) -> OutboundMessage:
    return OutboundMessage(
        outbound_id=outbound_id,
        kind="reply",
        platform="discord",
        bot_id="dc1",
        chat_id=chat,
        chat_type="group",
        conversation_key=f"discord:dc1:{chat}",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


def fresh_platform() -> DiscordPlatform:
    return DiscordPlatform()  # its own rate-limit memory


def messages_path(chat: str = CHANNEL) -> str:
    return f"/channels/{chat}/messages"


async def test_markdown_mentions_reply_and_fallbacks(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(messages_path(), check_discord)
    platform, bot = fresh_platform(), bot_config(api, language="en")
    message = outbound(
        [
            {"type": "mention", "data": {"target": ALICE}},
            {"type": "text", "data": {"text": " 2*3 @everyone <@&999> "}},
            {"type": "markdown", "data": {"content": "**bold** _it_ ~~gone~~ `a*b` [link](https://example.com/x)"}},
            {"type": "dice", "data": {}},
            {"type": "face", "data": {"id": "14"}},
            {"type": "share", "data": {"url": "https://example.com/s", "title": "Shared"}},
            {"type": "forward", "data": {"forward_id": "x"}},
        ],
        reply_to_message_id="7700000000000000007",
    )
    [call] = platform.render(bot, message)
    outcome = await platform.send(bot, call, http, load_media)
    assert outcome.status == "delivered" and outcome.platform_message_id
    [seen] = api.calls(messages_path())
    body = seen.json
    expected = discord.AllowedMentions(everyone=False, roles=False, users=[discord.Object(id=int(ALICE))])
    assert body["allowed_mentions"]["parse"] == expected.to_dict()["parse"]
    assert [int(u) for u in body["allowed_mentions"]["users"]] == expected.to_dict()["users"]
    assert body["message_reference"] == {"message_id": "7700000000000000007", "fail_if_not_exists": False}
    assert body["content"].startswith(
        f"<@{ALICE}> 2\\*3 @everyone \\<@&999\\> **bold** *it* ~~gone~~ `a*b` [link](https://example.com/x)"
    )
    assert "🎲 " in body["content"] and "🙂" in body["content"] and "[Shared](https://example.com/s)" in body["content"]
    assert "\\[forwarded messages cannot be shown here\\]" in body["content"]  # shown without the backslashes


def test_escaping_keeps_plain_text_literal() -> None:
    assert escape_markdown("# title\n- item\n> quote *x* _y_ `z` |s| [l](u)") == (
        "\\# title\n\\- item\n\\> quote \\*x\\* \\_y\\_ \\`z\\` \\|s\\| \\[l\\](u)"
    )


def test_nonces_are_stable_per_message_of_a_reply() -> None:
    platform, bot = fresh_platform(), bot_config()
    message = outbound([{"type": "text", "data": {"text": "lorem " * 800}}])
    first = [c.json["nonce"] for c in platform.render(bot, message) if c.json]
    again = [c.json["nonce"] for c in platform.render(bot, message) if c.json]
    assert first == again and len(set(first)) == len(first) >= 2
    other = platform.render(bot, outbound([{"type": "text", "data": {"text": "x"}}], outbound_id="out-e"))
    assert other[0].json is not None and other[0].json["nonce"] not in first


async def test_long_text_is_split_and_only_the_first_piece_replies(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(messages_path(), check_discord)
    platform, bot = fresh_platform(), bot_config(api)
    calls = platform.render(
        bot, outbound([{"type": "text", "data": {"text": "lorem_ipsum " * 500}}], reply_to_message_id="77")
    )
    assert len(calls) >= 4
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    sent = api.calls(messages_path())
    assert "".join(s.json["content"] for s in sent).count("lorem\\_ipsum") == 500
    assert ["message_reference" in s.json for s in sent] == [True] + [False] * (len(sent) - 1)


async def test_attachments_are_multipart_uploads(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(messages_path(), check_discord)
    platform, bot = fresh_platform(), bot_config(api, language="en")
    calls = platform.render(
        bot,
        outbound(
            [
                {"type": "text", "data": {"text": "here"}},
                {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
                {"type": "file", "data": {"media": {"kind": "file", "value": "file:///etc/shadow"}}},
            ]
        ),
    )
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    text, image, refused = api.calls(messages_path())
    assert text.json["content"] == "here"
    assert image.files["files[0]"] == ("file.png", PNG, "image/png")
    assert refused.json["content"] == "\\[attachment unavailable\\]"  # Discord has no reusable file ids
    # An unreadable attachment becomes the notice, sent as text.
    [call] = platform.render(bot, outbound([{"type": "image", "data": {"media": {"kind": "url", "value": "x"}}}]))
    assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    assert api.calls(messages_path())[-1].json["content"] == "[attachment unavailable]"


async def test_slash_command_reply_edits_the_deferred_response(api: FakeApi, http: httpx.AsyncClient) -> None:
    original = f"/webhooks/{BOT_USER}/{SLASH['token']}/messages/@original"
    followup = f"/webhooks/{BOT_USER}/{SLASH['token']}"
    api.on(original, check_discord)
    api.on(followup, check_discord)
    platform, bot = fresh_platform(), bot_config(api)
    route = {"interaction_token": str(SLASH["token"]), "application_id": BOT_USER}
    calls = platform.render(bot, outbound([{"type": "text", "data": {"text": "four " * 500}}], route=route))
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    assert len(api.calls(original)) == 1 and len(api.calls(followup)) == len(calls) - 1 >= 1


async def test_a_429_is_honoured_and_an_empty_bucket_waits(api: FakeApi, http: httpx.AsyncClient) -> None:
    platform, bot = fresh_platform(), bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    api.reply(
        messages_path(),
        429,
        {"message": "You are being rate limited.", "retry_after": 0.25, "global": False},
        {
            "Retry-After": "1",
            "X-RateLimit-Bucket": "abcd1234",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset-After": "0.25",
        },
        once=True,
    )
    api.on(messages_path(), check_discord)
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == ("retry", "rate_limited", 0.25)
    # The bucket is empty for a quarter second: a send now waits without calling Discord.
    early = await platform.send(bot, call, http, load_media)
    assert early.status == "retry" and 0 < (early.retry_after or 0) <= 0.25
    assert len(api.calls(messages_path())) == 1
    # Another channel is another bucket: not held up by this one.
    api.on(messages_path(DM_CHANNEL), check_discord)
    [other] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}], chat=DM_CHANNEL))
    assert (await platform.send(bot, other, http, load_media)).status == "delivered"
    await asyncio.sleep(0.3)
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    # A global 429 holds every route of the bot for its retry_after.
    api.reply(
        messages_path(), 429, {"message": "global", "retry_after": 2.0, "global": True}, {"X-RateLimit-Global": "true"}
    )
    assert (await platform.send(bot, call, http, load_media)).retry_after == 2.0
    held = await platform.send(bot, other, http, load_media)
    assert held.status == "retry" and 1.5 < (held.retry_after or 0) <= 2.0
    assert len(api.calls(messages_path(DM_CHANNEL))) == 1


@pytest.mark.parametrize(
    ("status", "body", "verdict", "reason"),
    [
        (403, {"message": "Missing Access", "code": 50001}, "permanent", "missing_access"),
        (403, {"message": "Missing Permissions", "code": 50013}, "permanent", "missing_permissions"),
        (404, {"message": "Unknown Channel", "code": 10003}, "permanent", "unknown_channel"),
        (400, {"message": "Invalid Form Body", "code": 50035, "errors": {}}, "permanent", "invalid_form_body"),
        (401, {"message": "401: Unauthorized", "code": 0}, "permanent", "unauthorized"),
        (502, "bad gateway", "retry", "server_error"),
    ],
)
async def test_error_classification(
    api: FakeApi, http: httpx.AsyncClient, status: int, body: Any, verdict: str, reason: str
) -> None:
    api.reply(messages_path(), status, body)
    platform, bot = fresh_platform(), bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == (verdict, reason)
    if isinstance(body, dict):
        assert body["message"] in outcome.detail  # Discord's own words reach the dead letter


async def test_a_wrong_token_is_refused_by_the_stand_in(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on(messages_path(), check_discord)
    platform = fresh_platform()
    bot = BotConfig(platform="discord", bot_id="dc1", self_id=BOT_USER, credentials={"token": "x"}, api_base=api.url)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "unauthorized")


def test_the_bots_file_names_what_a_discord_bot_lacks() -> None:
    with pytest.raises(ConfigurationError) as error:
        check_bots(Settings(bots=[{"platform": "discord", "bot_id": "d", "credentials": {"token": TOKEN}}]))
    text = str(error.value)
    assert "self_id" in text and "public_key" in text  # a webhook bot needs the interactions key
    gateway = Settings(
        bots=[
            {
                "platform": "discord",
                "bot_id": "d",
                "self_id": BOT_USER,
                "transport": "gateway",
                "credentials": {"token": TOKEN},
            }
        ]
    )
    assert gateway.bots[0].transport == "gateway"
    with pytest.raises(ConfigurationError, match="token"):
        check_bots(Settings(bots=[{"platform": "discord", "bot_id": "d", "self_id": BOT_USER, "transport": "gateway"}]))
    # The token is one of the secrets every outbound message is checked for, and never printed.
    assert TOKEN in {s.value for s in deployment_secrets(gateway)}
    assert TOKEN not in repr(gateway) and TOKEN not in str(gateway.model_dump())


async def test_typing_is_shown_with_the_bot_token(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.reply(f"/channels/{CHANNEL}/typing", 204, b"")
    await fresh_platform().typing(bot_config(api), CHANNEL, http)
    [seen] = api.calls(f"/channels/{CHANNEL}/typing")
    assert seen.method == "POST" and seen.headers["authorization"] == f"Bot {TOKEN}"
