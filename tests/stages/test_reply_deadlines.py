"""Reply deadlines: the pure decisions, and the check against a real Redis (turns recorded as
dispatch records them; what it produces goes to a recorder at the producer seam; the whole path
through the broker to the QQ stand-in is in tests/integration/test_platforms_e2e.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pipeline.platforms import get_platform
from pipeline.segments.notices import DEFAULT_NOTICES, NoticeKind
from pipeline.settings import BotConfig, Settings
from pipeline.stages.deadlines import (
    CLAIM_MS,
    ReplyDeadlines,
    member,
    notice_due_ms,
    notice_kind,
    parse_member,
    verdict,
)
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.state import State, TurnRecord

from .turns import Recorder, running_turn

CREDENTIALS = {"app_id": "11111111", "app_secret": "DG5g3B4j9X2KOErG"}
GROUP = "group:C9F778FE6ADF9D1D1DBE395BF744A33A"
WINDOW_MS = 290_000  # a group's passive window less egress's margin


# -- pure -----------------------------------------------------------------------------------------


def test_entry_names_the_turn_and_its_conversation() -> None:
    conversation = "qqbot:qb1:group:G 1:member"  # a conversation key may hold anything after its ids
    assert parse_member(member("sevt-sb-0123abcd", conversation)) == ("sevt-sb-0123abcd", conversation)


def test_notice_is_due_the_lead_before_the_deadline() -> None:
    assert notice_due_ms(1_000_000, 30) == 970_000
    assert notice_due_ms(1_000_000, 0.5) == 999_500


def test_notice_kind_follows_active_messages() -> None:
    bot = BotConfig(platform="qqbot", bot_id="qb1", credentials=CREDENTIALS)
    assert notice_kind(bot) is NoticeKind.REPLY_WINDOW_CLOSING
    active = bot.model_copy(update={"active_messages": True})
    assert notice_kind(active) is NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE


def test_verdict() -> None:
    assert verdict(running=True, now=100, deadline_ms=200) == "notice"
    assert verdict(running=False, now=100, deadline_ms=200) == "ended"  # the answer came in time
    assert verdict(running=True, now=200, deadline_ms=200) == "too_late"  # nothing would get through
    assert verdict(running=False, now=300, deadline_ms=200) == "ended"


def test_every_language_has_both_notices() -> None:
    for language, texts in DEFAULT_NOTICES.items():
        assert texts[NoticeKind.REPLY_WINDOW_CLOSING] != texts[NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE], language


# -- against Redis --------------------------------------------------------------------------------


def notices_counted(kind: str) -> float:
    labels = {"platform": "qqbot", "notice": kind}
    return REGISTRY.get_sample_value("switchboard_notices_total", labels) or 0.0


def settings(prefix: str, **bot: Any) -> Settings:
    return Settings(
        redis_prefix=prefix,
        bots=[{"platform": "qqbot", "bot_id": "qb1", "credentials": CREDENTIALS, "language": "en", **bot}],
    )


@pytest.fixture
async def state(redis_url: str, redis_prefix: str) -> AsyncIterator[State]:
    state = State.connect(redis_url, redis_prefix, mapping_ttl=600, dedup_ttl=300)
    yield state
    await state.redis.aclose()


def deadlines(s: Settings, state: State) -> tuple[ReplyDeadlines, Recorder]:
    recorder = Recorder()
    platforms = {name: get_platform(name) for name in ("qqbot", "telegram")}
    return ReplyDeadlines(s, state, Outputs(recorder), Notifier(s), platforms), recorder


def turn_record(at_ms: float, *, chat_id: str = GROUP, msg_id: str = "ROBOT1.0_m1") -> TurnRecord:
    return TurnRecord(
        trace_id="t-1",
        platform="qqbot",
        bot_id="qb1",
        chat_id=chat_id,
        chat_type="group",
        route={"msg_id": msg_id, "at_ms": str(int(at_ms))},
        hops={"ingress": at_ms},
    )


async def started(watch: ReplyDeadlines, state: State, conversation: str, turn_id: str, turn: TurnRecord) -> BotConfig:
    """A turn as dispatch starts it: recorded running, its notice scheduled."""
    bot = watch.settings.bots[0]
    await running_turn(state, conversation, turn, turn_id)
    await watch.turn_started(bot, conversation, turn_id, turn.chat_id, turn.route)
    return bot


async def test_a_turn_running_when_its_notice_is_due_gets_one_notice(state: State, redis_prefix: str) -> None:
    watch, recorder = deadlines(settings(redis_prefix), state)
    assert watch.watching
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    await started(watch, state, conversation, "sevt-sb-slow", turn_record(at))
    counted = notices_counted("reply_window_closing")
    # Before the notice is due (30 s before the deadline): nothing.
    assert await watch.check(at + WINDOW_MS - 31_000) == 0
    assert await watch.check(at + WINDOW_MS - 29_000) == 1
    [notice] = recorder.replies()
    assert notice.kind == "notice" and notice.chat_id == GROUP and notice.conversation_key == conversation
    assert notice.route["msg_id"] == "ROBOT1.0_m1"  # a passive reply to the user's message
    assert notice.segments[0].data.text == DEFAULT_NOTICES["en"][NoticeKind.REPLY_WINDOW_CLOSING]  # type: ignore[union-attr]
    assert notices_counted("reply_window_closing") == counted + 1
    # Handled once: later checks produce nothing.
    assert await watch.check(at + WINDOW_MS - 1_000) == 0
    assert len(recorder.replies()) == 1
    assert not await state.redis.execute("ZRANGE", state.keys.reply_deadlines(), 0, -1)


async def test_a_turn_that_ended_in_time_gets_no_notice(state: State, redis_prefix: str) -> None:
    watch, recorder = deadlines(settings(redis_prefix), state)
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    turn = turn_record(at)
    bot = await started(watch, state, conversation, "sevt-sb-fast", turn)
    await watch.turn_ended(bot, conversation, "sevt-sb-fast", turn)  # render, at the turn's end
    assert not await state.redis.execute("ZRANGE", state.keys.reply_deadlines(), 0, -1)
    assert await watch.check(at + WINDOW_MS - 1_000) == 0
    assert recorder.replies() == []


async def test_a_turn_no_longer_running_is_dropped_when_due(state: State, redis_prefix: str) -> None:
    """A turn that ended another way (its send failed, its session died) is not unscheduled by
    render: the check finds it no longer among the session's turns."""
    watch, recorder = deadlines(settings(redis_prefix), state)
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    await started(watch, state, conversation, "sevt-sb-failed", turn_record(at))
    await state.conversations.drop_turn(conversation, "sevt-sb-failed")  # dispatch, after a failed send
    assert await watch.check(at + WINDOW_MS - 1_000) == 0
    assert recorder.replies() == []
    assert not await state.redis.execute("ZRANGE", state.keys.reply_deadlines(), 0, -1)


async def test_past_the_deadline_nothing_is_sent(state: State, redis_prefix: str) -> None:
    watch, recorder = deadlines(settings(redis_prefix), state)
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    await started(watch, state, conversation, "sevt-sb-late", turn_record(at))
    assert await watch.check(at + WINDOW_MS + 1) == 0  # every worker was down until after it
    assert recorder.replies() == []
    # A turn that starts when its message's window has already closed is not even scheduled.
    await started(watch, state, conversation, "sevt-sb-older", turn_record(at - 400_000, msg_id="old"))
    assert not await state.redis.execute("ZRANGE", state.keys.reply_deadlines(), 0, -1)


async def test_a_claim_left_by_a_dead_worker_is_finished_by_another_with_the_same_id(
    state: State, redis_prefix: str
) -> None:
    watch, recorder = deadlines(settings(redis_prefix), state)
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    await started(watch, state, conversation, "sevt-sb-crash", turn_record(at))
    due = at + WINDOW_MS - 29_000
    # A worker claims the entry and dies before it handled it.
    assert await state.deadlines.claim_due(due, claim_ms=CLAIM_MS, limit=10) == [member("sevt-sb-crash", conversation)]
    assert await watch.check(due + 1_000) == 0  # still claimed
    assert await watch.check(due + CLAIM_MS + 1) == 1  # the claim ran out: another worker sends it
    # Had the first worker produced its notice before dying, the second one's has the same id (egress
    # delivers an outbound id once).
    replay = Recorder()
    again = ReplyDeadlines(watch.settings, state, Outputs(replay), watch.notifier, watch.platforms)
    await again.turn_started(watch.settings.bots[0], conversation, "sevt-sb-crash", GROUP, turn_record(at).route)
    assert await again.check(due + CLAIM_MS + 2) == 1
    assert replay.replies()[0].outbound_id == recorder.replies()[0].outbound_id


async def test_workers_checking_together_send_one_notice(state: State, redis_prefix: str) -> None:
    s = settings(redis_prefix)
    watchers = [deadlines(s, state) for _ in range(4)]
    at = time.time() * 1000
    for n in range(30):
        await started(watchers[0][0], state, f"qqbot:qb1:{GROUP}{n}", f"sevt-sb-many{n}", turn_record(at))
    due = at + WINDOW_MS - 29_000
    counts = await asyncio.gather(*(watch.check(due) for watch, _ in watchers))
    assert sum(counts) == 30
    ids = [m.outbound_id for _, recorder in watchers for m in recorder.replies()]
    assert len(ids) == len(set(ids)) == 30


async def test_with_active_messages_the_notice_says_the_answer_comes_separately(
    state: State, redis_prefix: str
) -> None:
    watch, recorder = deadlines(settings(redis_prefix, active_messages=True, language="zh"), state)
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    await started(watch, state, conversation, "sevt-sb-active", turn_record(at))
    assert await watch.check(at + WINDOW_MS - 1_000) == 1
    [notice] = recorder.replies()
    text = notice.segments[0].data.text  # type: ignore[union-attr]
    assert text == DEFAULT_NOTICES["zh"][NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE]


async def test_the_notice_lead_and_its_text_are_per_bot(state: State, redis_prefix: str) -> None:
    custom = "Too slow for QQ, ask again."
    s = settings(redis_prefix, reply_window_notice_seconds=120, notices={"reply_window_closing": custom})
    watch, recorder = deadlines(s, state)
    at = time.time() * 1000
    conversation = f"qqbot:qb1:{GROUP}"
    await started(watch, state, conversation, "sevt-sb-lead", turn_record(at))
    assert await watch.check(at + WINDOW_MS - 121_000) == 0
    assert await watch.check(at + WINDOW_MS - 119_000) == 1
    assert recorder.replies()[0].segments[0].data.text == custom  # type: ignore[union-attr]


async def test_platforms_without_windows_and_a_zero_lead_schedule_nothing(state: State, redis_prefix: str) -> None:
    off = settings(redis_prefix, reply_window_notice_seconds=0)
    watch, _ = deadlines(off, state)
    assert not watch.watching
    at = time.time() * 1000
    await watch.turn_started(off.bots[0], "qqbot:qb1:g", "sevt-sb-off", GROUP, turn_record(at).route)
    telegram = Settings(
        redis_prefix=redis_prefix, bots=[{"platform": "telegram", "bot_id": "tg1", "credentials": {"token": "1:x"}}]
    )
    watch, _ = deadlines(telegram, state)
    assert not watch.watching
    await watch.turn_started(telegram.bots[0], "telegram:tg1:1", "sevt-sb-tg", "1", {"message_id": "5"})
    assert not await state.redis.execute("ZRANGE", state.keys.reply_deadlines(), 0, -1)
