"""Fuzzed webhooks: a valid payload of each platform with one field replaced by an arbitrary JSON
value (or arbitrary bytes) is either parsed or rejected with a 4xx: never a crash."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.platforms import WebhookRejected, WebhookRequest, WebhookResult, get_platform
from pipeline.settings import BotConfig

from . import test_dingtalk, test_discord, test_lark, test_matrix, test_onebot, test_qqbot, test_satori, test_slack

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


def _telegram_fixture() -> dict[str, Any]:
    return {
        "update_id": 9001,
        "message": {
            "message_id": 42,
            "date": 1796000000,
            "text": "👋 @switch_bot hi",
            "chat": {"id": -100123, "type": "supergroup", "title": "T", "is_forum": True},
            "from": {"id": 1001, "is_bot": False, "first_name": "Alice"},
            "entities": [
                {"type": "mention", "offset": 3, "length": 11},
                {
                    "type": "text_mention",
                    "offset": 0,
                    "length": 2,
                    "user": {"id": 7, "is_bot": False, "first_name": "B"},
                },
            ],
            "photo": [{"file_id": "p", "file_unique_id": "u", "width": 1, "height": 1}],
            "reply_to_message": {
                "message_id": 40,
                "date": 1796000000,
                "chat": {"id": -100123, "type": "supergroup"},
                "from": {"id": 777, "is_bot": True, "first_name": "S"},
                "text": "x",
            },
            "message_thread_id": 10,
            "is_topic_message": True,
        },
    }


FIXTURES: dict[str, tuple[BotConfig, list[dict[str, Any]]]] = {
    "onebot": (
        test_onebot.bot_config(),
        [
            test_onebot.SPEC_PRIVATE,
            test_onebot.group_event(
                [
                    {"type": "reply", "data": {"id": "1"}},
                    {"type": "at", "data": {"qq": "10001000"}},
                    {"type": "image", "data": {"file": "a", "url": "https://x"}},
                    {"type": "face", "data": {"id": "14"}},
                ]
            ),
        ],
    ),
    "telegram": (
        BotConfig(platform="telegram", bot_id="tg1", self_id="777", username="switch_bot"),
        [_telegram_fixture()],
    ),
    "slack": (
        test_slack.bot_config(),
        [
            test_slack.callback(
                dict(
                    test_slack.APP_MENTION,
                    thread_ts="1.0",
                    parent_user_id="U0LAN0Z89",
                    files=[{"id": "F1", "mimetype": "image/png"}],
                )
            ),
            test_slack.callback(test_slack.DM),
        ],
    ),
    "dingtalk": (
        test_dingtalk.bot_config(),
        [
            test_dingtalk.message(
                group=True, at_bot=True, atUsers=[{"dingtalkId": "$:LWCP_v1:$b", "staffId": "b1"}], text="hi"
            ),
            test_dingtalk.message(
                "richText", content={"richText": [{"text": "a"}, {"type": "picture", "downloadCode": "d"}]}
            ),
        ],
    ),
    "discord": (
        test_discord.bot_config(),
        [
            json.loads(
                test_discord.dispatch(
                    test_discord.message_create(
                        f"<@{test_discord.BOT_USER}> hi <:e:1>",
                        mentions=[test_discord.user(test_discord.BOT_USER, "sb")],
                        message_reference={"message_id": "8"},
                        referenced_message={"id": "8", "author": test_discord.user("9", "x"), "content": "q"},
                        attachments=[{"id": "1", "content_type": "image/png", "url": "https://cdn/x.png"}],
                    )
                )
            ),
            test_discord.SLASH,
        ],
    ),
    "lark": (
        BotConfig(platform="lark", bot_id="lk1", self_id=test_lark.BOT_OPEN_ID),
        [
            test_lark.receive_event(
                "text", {"text": "@_user_1 hi"}, mentions=[test_lark.mention("@_user_1", test_lark.BOT_OPEN_ID, "S")]
            ),
            test_lark.receive_event(
                "post",
                {"title": "t", "content": [[{"tag": "at", "user_id": "@_user_1"}, {"tag": "img", "image_key": "k"}]]},
                parent_id="om_p",
            ),
        ],
    ),
    "satori": (
        test_satori.bot_config(),
        [
            test_satori.message_event(
                [test_satori.Quote("q1")(test_satori.Author("1")), test_satori.At(test_satori.BOT)], group=True
            ),
            test_satori.message_event([test_satori.Image("https://x/a.png")], group=False),
        ],
    ),
    "matrix": (
        test_matrix.bot_config(),
        [
            json.loads(
                test_matrix.frame(
                    test_matrix.Homeserver().text_event(test_matrix.ROOM, test_matrix.ALICE, "hi", mention=True)
                ).body
            ),
            json.loads(
                test_matrix.frame(
                    {
                        **test_matrix.Homeserver().text_event(test_matrix.ROOM, test_matrix.ALICE, "x", reply_to="$p"),
                        "content": {
                            "msgtype": "m.image",
                            "body": "cap",
                            "filename": "a.png",
                            "url": "mxc://example.org/abc",
                            "m.relates_to": {
                                "rel_type": "m.thread",
                                "event_id": "$r",
                                "m.in_reply_to": {"event_id": "$p"},
                            },
                            "m.mentions": {"user_ids": [test_matrix.BOT_USER]},
                        },
                    },
                    direct=True,
                    reply_sender=test_matrix.BOT_USER,
                ).body
            ),
        ],
    ),
    "qqbot": (
        test_qqbot.bot_config(),
        [
            test_qqbot.group_at("hi", attachments=[{"content_type": "image/png", "url": "gchat.qpic.cn/x"}]),
            test_qqbot.guild_at("<@!200> x <emoji:13>", message_reference={"message_id": "p"}),
            test_qqbot.direct("dm"),
            {"op": 13, "d": {"plain_token": "Arq0D5A61EgUu4OxUvOp", "event_ts": "1725442341"}},
        ],
    ),
}

CASES = [(name, n) for name, (_, fixtures) in FIXTURES.items() for n in range(len(fixtures))]


# Both end up as metric labels: a bounded vocabulary, never text taken from the payload.
REASONS = {"malformed_json", "malformed_payload", "bad_encryption"}
IGNORED = {
    None,
    "not_message",
    "own_message",
    "bot_sender",
    "bot_or_subtype",
    "url_verification",
    "unsupported_chat",
    "unsupported_message",
    "no_staff_id",
    "empty_message",
    "ping",
    "other_login",
    "notice",
    "edit",
}


def _check(platform_name: str, bot: BotConfig, body: bytes) -> None:
    platform = get_platform(platform_name)
    try:
        result = platform.parse(bot, WebhookRequest(headers={}, body=body))
    except WebhookRejected as exc:
        assert 400 <= exc.status < 500 and exc.reason in REASONS
        return
    assert isinstance(result, WebhookResult) and result.ignored in IGNORED
    for message in result.messages:
        message.model_dump_json()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), data=st.data(), new=json_values)
def test_one_field_replaced(case: tuple[str, int], data: st.DataObject, new: Any) -> None:
    name, index = case
    bot, fixtures = FIXTURES[name]
    fixture = fixtures[index]
    path = data.draw(st.sampled_from(_paths(fixture)))
    _check(name, bot, json.dumps(_replace(fixture, path, new)).encode())


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(FIXTURES)),
    body=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()),
)
def test_arbitrary_bodies(name: str, body: bytes) -> None:
    _check(name, FIXTURES[name][0], body)


def test_deeply_nested_json() -> None:
    for name, (bot, _) in FIXTURES.items():
        _check(name, bot, b"[" * 100_000 + b"]" * 100_000)
