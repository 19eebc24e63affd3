"""The dead letters' pure side: where a letter comes from, filtering, counting, listing without
bodies, and the replay plan (target topic, the replay mark, what is reported instead of sent)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from pipeline.operator.letters import (
    Letter,
    LetterFilter,
    ReplayContext,
    counts,
    mark_replayed,
    parse_when,
    plan,
    plan_one,
    render_table,
    summary,
    tally,
)
from pipeline.platforms import get_platform, known_platforms
from pipeline.platforms.base import Platform
from pipeline.records import DeadLetter, OutboundMessage, SessionCommand
from pipeline.segments import segment_list_adapter
from pipeline.settings import BotConfig
from pipeline.stages.outputs import DEAD_LETTER_RECORD_MAX_BYTES, Outputs

NOW = 1_800_000_000_000.0
TG = BotConfig(platform="telegram", bot_id="tg1", credentials={"token": "1:AA", "webhook_secret": "s"})
QQ = BotConfig(platform="qqbot", bot_id="qb1", credentials={"app_id": "1", "app_secret": "x" * 32})
QQ_ACTIVE = BotConfig(
    platform="qqbot", bot_id="qb2", active_messages=True, credentials={"app_id": "1", "app_secret": "x" * 32}
)
BOTS = {(b.platform, b.bot_id): b for b in (TG, QQ, QQ_ACTIVE)}


def reply(platform: str, bot: str, chat: str, text: str = "secret words", **extra: Any) -> OutboundMessage:
    return OutboundMessage(
        outbound_id=extra.pop("outbound_id", f"out-{chat}"),
        kind="reply",
        platform=platform,
        bot_id=bot,
        chat_id=chat,
        chat_type="group",
        conversation_key=f"{platform}:{bot}:{chat}",
        segments=segment_list_adapter.validate_python([{"type": "text", "data": {"text": text}}]),
        hops={"ingress": NOW - 60_000},
        **extra,
    )


def letter(
    position: int,
    stage: str = "egress",
    reason: str = "blocked",
    record: str | None = None,
    *,
    at_ms: float = NOW - 1000,
    **fields: Any,
) -> Letter:
    if record is None:
        record = reply("telegram", "tg1", f"c{position}").model_dump_json()
    dead = DeadLetter(stage=stage, reason=reason, record=record, at_ms=at_ms, **fields)
    return Letter.of(0, position, int(at_ms), dead.model_dump_json().encode())


def context(**extra: Any) -> ReplayContext:
    def platform(name: str) -> Platform | None:
        return get_platform(name) if name in known_platforms() else None

    return ReplayContext(bot=lambda p, b: BOTS.get((p, b)), platform=platform, now_ms=NOW, **extra)


def test_origin_from_the_record_else_from_the_key() -> None:
    egress = letter(1)
    assert (egress.platform, egress.bot_id, egress.chat_id) == ("telegram", "tg1", "c1")
    webhook = letter(2, "ingress", "parser_error", "{not json", key="lark:lk1")
    assert (webhook.platform, webhook.bot_id, webhook.chat_id) == ("lark", "lk1", None)
    keyed = letter(3, "render", "handler_error", "{}", key="slack:sl1:C%3A1")  # an encoded ':' in the chat id
    assert (keyed.platform, keyed.bot_id, keyed.chat_id) == ("slack", "sl1", "C:1")
    broken = Letter.of(0, 4, 5, b"not a dead letter")
    assert broken.dead is None and broken.reason == "unreadable" and broken.stage == "?"


def test_filter_by_each_field_and_time() -> None:
    letters = [
        letter(1, at_ms=NOW - 3 * 3_600_000),
        letter(2, reason="not_in_chat", record=reply("lark", "lk1", "oc_1").model_dump_json(), at_ms=NOW - 600_000),
        letter(3, "dispatch", "session_api_error", key="telegram:tg1:c3", record="{}"),
    ]
    assert [x.offset for x in LetterFilter(stages=frozenset({"egress"})).select(letters)] == [1, 2]
    assert [x.offset for x in LetterFilter(reasons=frozenset({"not_in_chat"})).select(letters)] == [2]
    assert [x.offset for x in LetterFilter(platforms=frozenset({"telegram"})).select(letters)] == [1, 3]
    assert [x.offset for x in LetterFilter(bots=frozenset({"lk1"})).select(letters)] == [2]
    assert [x.offset for x in LetterFilter(chats=frozenset({"c3"})).select(letters)] == [3]
    since = LetterFilter(since_ms=parse_when("1h", NOW))
    assert [x.offset for x in since.select(letters)] == [2, 3]
    until = LetterFilter(until_ms=parse_when("5m", NOW))
    assert [x.offset for x in until.select(letters)] == [1, 2]
    both = LetterFilter(stages=frozenset({"egress"}), platforms=frozenset({"telegram"}))
    assert [x.offset for x in both.select(letters)] == [1]


def test_parse_when_takes_durations_and_iso_times_in_utc() -> None:
    assert parse_when("90s", NOW) == NOW - 90_000
    assert parse_when("2d", NOW) == NOW - 2 * 86_400_000
    assert parse_when("2026-12-06T10:00", NOW) == parse_when("2026-12-06T10:00:00Z", NOW) == 1796551200000.0
    assert parse_when("2026-12-06T12:00+02:00", NOW) == 1796551200000.0
    with pytest.raises(ValueError, match="neither a duration"):
        parse_when("yesterday", NOW)


def test_counts_most_frequent_first() -> None:
    letters = [letter(1), letter(2, reason="x"), letter(3), letter(4, "dispatch", "y", "{}")]
    assert counts(letters) == [("egress", "blocked", 2), ("dispatch", "y", 1), ("egress", "x", 1)]


def test_summary_has_no_body_unless_asked() -> None:
    found = letter(1, error="E" * 500, topic="im.outbound.telegram", partition=2, offset=7, key="telegram:tg1:c1")
    row = summary(found)
    text = json.dumps(row)
    assert "secret words" not in text
    assert row["original"]["outbound_id"] == "out-c1" and row["original"]["segments"] == ["text"]
    assert row["source"] == "im.outbound.telegram[2]@7" and len(row["error"]) == 200
    assert summary(found, full_error=True)["error"] == "E" * 500
    assert "secret words" in summary(found, bodies=True)["record"]
    lines = render_table([row], ["position", "stage", "chat", "bot"])
    assert lines[0].split() == ["POSITION", "STAGE", "CHAT", "BOT"] and lines[1].split() == [
        "0:1",
        "egress",
        "c1",
        "tg1",
    ]


def test_replay_goes_back_to_the_source_topic_with_the_same_ids_and_a_replay_mark() -> None:
    original = reply("telegram", "tg1", "c1")
    found = letter(1, record=original.model_dump_json(), topic="im.outbound.telegram", key="telegram:tg1:c1")
    planned = plan_one(found, context())
    assert planned.sendable and planned.topic == "im.outbound.telegram" and planned.key == "telegram:tg1:c1"
    assert planned.value is not None
    back = OutboundMessage.model_validate_json(planned.value)
    assert back.hops == {**original.hops, "replay": NOW}
    assert back.model_copy(update={"hops": original.hops}) == original  # nothing else changed
    assert planned.delivered_marker == ("telegram:tg1", "out-c1")


def test_a_stage_without_a_recorded_topic_goes_to_the_topic_it_reads() -> None:
    command = SessionCommand(
        kind="user_turn",
        conversation_key="telegram:tg1:c9",
        platform="telegram",
        bot_id="tg1",
        chat_id="c9",
        chat_type="private",
        trace_id="t1",
    )
    planned = plan_one(letter(1, "dispatch", "session_api_error", command.model_dump_json()), context())
    assert planned.sendable and planned.topic == "session.input" and planned.key == "telegram:tg1:c9"
    assert planned.delivered_marker is None
    gone = command.model_copy(update={"bot_id": "gone", "conversation_key": "telegram:gone:c9"})
    assert plan_one(letter(2, "dispatch", "unknown_bot", gone.model_dump_json()), context()).skip == "unknown_bot"


def test_what_is_reported_and_not_sent() -> None:
    now_s = str(int(NOW))
    late = reply("qqbot", "qb1", "group:G1", route={"msg_id": "m1", "at_ms": str(int(NOW - 600_000))})
    fresh = reply("qqbot", "qb1", "group:G2", route={"msg_id": "m2", "at_ms": now_s})
    late_active = reply("qqbot", "qb2", "group:G3", route={"msg_id": "m3", "at_ms": str(int(NOW - 600_000))})
    cases = {
        "past_reply_window": letter(1, record=late.model_dump_json()),
        "replay": letter(2, record=fresh.model_dump_json()),
        # A bot with active messages still reaches the chat after the window.
        "replay-active": letter(3, record=late_active.model_dump_json()),
        "not_replayable": letter(4, "ingress", "parser_error", "{broken", key="lark:lk1"),
        "unparsable": letter(5, "egress", "invalid_record", '{"kind": 1}', topic="im.outbound.telegram"),
        "unsure": letter(6, reason="outcome_unknown"),
        "unknown_bot": letter(7, record=reply("telegram", "nope", "c7").model_dump_json()),
        "excerpt_only": letter(
            8, record='{"outbound_id":', record_bytes=90_000, record_sha256="ab" * 32, topic="im.outbound.telegram"
        ),
        # The platform said so, and the route tells no time (a Discord interaction token).
        "past_reply_window-reason": letter(
            9, reason="invalid_webhook_token", record=reply("telegram", "tg1", "x").model_dump_json()
        ),
    }
    for expected, found in cases.items():
        planned = plan_one(found, context())
        assert (planned.skip or "replay") == expected.split("-")[0], (expected, planned)
        assert planned.sendable == (planned.value is not None)
    assert "closed at" in plan_one(cases["past_reply_window"], context()).detail
    # Named explicitly, an unsure reason is replayed.
    assert plan_one(cases["unsure"], context(named_reasons=frozenset({"outcome_unknown"}))).sendable
    assert tally(plan(list(cases.values()), context())) == {
        "replay": 2,
        "past_reply_window": 2,
        "excerpt_only": 1,
        "not_replayable": 1,
        "unknown_bot": 1,
        "unparsable": 1,
        "unsure": 1,
    }


def test_an_excerpt_is_replayed_from_the_original_read_back() -> None:
    whole = reply("telegram", "tg1", "c1", text="x" * 100).model_dump_json().encode()
    found = letter(
        1,
        record=whole[:40].decode(),
        record_bytes=len(whole),
        record_sha256=hashlib.sha256(whole).hexdigest(),
        topic="im.outbound.telegram",
        partition=0,
        offset=3,
    )
    planned = plan_one(found, context(originals={"0:1": whole}))
    assert planned.sendable and planned.value is not None
    assert OutboundMessage.model_validate_json(planned.value).outbound_id == "out-c1"


def test_mark_replayed_keeps_other_hops_and_fields() -> None:
    raw = b'{"a": "\xc3\xa9", "hops": {"ingress": 1.0}}'
    assert json.loads(mark_replayed(raw, 5.0)) == {"a": "é", "hops": {"ingress": 1.0, "replay": 5.0}}
    assert json.loads(mark_replayed(b'{"a": 1}', 5.0)) == {"a": 1, "hops": {"replay": 5.0}}


async def test_a_dead_letter_keeps_a_bounded_excerpt_of_a_large_original() -> None:
    sent: list[tuple[str, str | None, bytes]] = []

    async def send(topic: str, key: str | None, value: bytes) -> None:
        sent.append((topic, key, value))

    outputs = Outputs(send)
    large = "é" * DEAD_LETTER_RECORD_MAX_BYTES  # two bytes a character: twice the cap
    await outputs.dead_letter("egress", "blocked", large, key="k", topic="im.outbound.telegram", partition=1, offset=9)
    await outputs.dead_letter("egress", "blocked", "small", key="k")
    big, small = (DeadLetter.model_validate_json(value) for _topic, _key, value in sent)
    assert len(big.record.encode()) == DEAD_LETTER_RECORD_MAX_BYTES and large.startswith(big.record)
    assert big.record_bytes == len(large.encode()) and big.record_sha256 == hashlib.sha256(large.encode()).hexdigest()
    assert (big.topic, big.partition, big.offset) == ("im.outbound.telegram", 1, 9)  # where the whole one is
    assert small.record == "small" and small.record_bytes is None and small.record_sha256 is None


def test_of_several_letters_of_one_message_only_the_newest_is_sent() -> None:
    record = reply("telegram", "tg1", "c1").model_dump_json()
    letters = [letter(1, record=record), letter(2, record=reply("telegram", "tg1", "c2").model_dump_json())]
    letters.append(letter(3, reason="retries_exhausted", record=record))  # the same message, again
    planned = plan(letters, context())
    assert [(p.letter.offset, p.skip) for p in planned] == [(1, "duplicate"), (2, None), (3, None)]
    assert planned[0].detail.endswith("0:3")
