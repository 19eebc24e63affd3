"""Inbound rate limits: the windows a message counts in (pure), and the Redis step on a real Redis."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.controls.limits import LimitsConfig, LimitWindow, TurnRequest, counters
from pipeline.state.limits import TurnLimiter
from tests.conftest import connect_state

pytestmark = pytest.mark.usefixtures("close_connected_states")

BOT = "console:demo"
HOUR_MS = 3_600_000


def config(**windows: dict[str, int]) -> LimitsConfig:
    return LimitsConfig.model_validate(windows)


def test_the_windows_a_message_counts_in() -> None:
    limits = config(user_turns={"count": 2, "per_seconds": 60}, bot_turns={"count": 100, "per_seconds": 3600})
    found = counters(limits, TurnRequest("d1", "alice", "g1"), 7_200_000)
    assert [(c.scope, c.ident, c.limit, c.window_ms) for c in found] == [
        ("user", "user:alice:120", 2, 60_000),
        ("bot", "bot:-:2", 100, 3_600_000),
    ]
    # The next window has another index: its counter starts from nothing.
    assert counters(limits, TurnRequest("d1", "alice", "g1"), 7_260_000)[0].ident == "user:alice:121"


def test_a_limit_needs_a_positive_count_and_window() -> None:
    with pytest.raises(ValidationError):
        LimitWindow(count=0, per_seconds=60)
    with pytest.raises(ValidationError):
        LimitWindow(count=1, per_seconds=0)
    with pytest.raises(ValidationError):
        LimitsConfig.model_validate({"user_turn": {"count": 1, "per_seconds": 1}})  # a typo is an error
    assert not LimitsConfig().active


def limiter(redis_url: str, prefix: str) -> TurnLimiter:
    state = connect_state(redis_url, prefix)
    return TurnLimiter(state.redis, state.keys)


async def test_over_the_user_limit_one_notice_per_window(redis_url: str, redis_prefix: str) -> None:
    limits = config(user_turns={"count": 2, "per_seconds": 3600})
    turns = limiter(redis_url, redis_prefix)
    now = 10 * HOUR_MS + 5
    batch = [(BOT, limits, TurnRequest(f"m{i}", "alice", f"g{i % 2}")) for i in range(5)]
    decisions = await turns.admit(batch, now)
    assert [d.outcome for d in decisions] == ["allowed", "allowed", "noticed", "limited", "limited"]
    assert decisions[2].scope == "user"
    # Another batch in the same window: still over, and no second notice.
    (later,) = await turns.admit([(BOT, limits, TurnRequest("m9", "alice", "g3"))], now + 1000)
    assert later.outcome == "limited"
    # Another user is not affected; the next window starts afresh, with its own notice.
    (bob,) = await turns.admit([(BOT, limits, TurnRequest("b1", "bob", "g1"))], now)
    assert bob.allowed
    next_window = [(BOT, limits, TurnRequest(f"n{i}", "alice", "g1")) for i in range(3)]
    assert [d.outcome for d in await turns.admit(next_window, now + HOUR_MS)] == ["allowed", "allowed", "noticed"]


async def test_a_replayed_message_gets_its_first_answer_and_counts_once(redis_url: str, redis_prefix: str) -> None:
    limits = config(chat_turns={"count": 2, "per_seconds": 3600})
    turns = limiter(redis_url, redis_prefix)
    now = 20 * HOUR_MS
    first = await turns.admit([(BOT, limits, TurnRequest(f"m{i}", f"u{i}", "g")) for i in range(3)], now)
    replay = await turns.admit([(BOT, limits, TurnRequest(f"m{i}", f"u{i}", "g")) for i in range(3)], now)
    assert [d.outcome for d in first] == ["allowed", "allowed", "noticed"]
    # The notice decision too (the notice's stable id sends it once), marked as given before, so
    # the metrics do not count it again.
    assert [(d.allowed, d.scope, d.notice) for d in replay] == [(d.allowed, d.scope, d.notice) for d in first]
    assert [d.again for d in first] == [False] * 3 and replay[2].again


async def test_a_message_over_one_limit_is_not_counted_in_the_others(redis_url: str, redis_prefix: str) -> None:
    limits = config(user_turns={"count": 1, "per_seconds": 3600}, chat_turns={"count": 2, "per_seconds": 3600})
    turns = limiter(redis_url, redis_prefix)
    now = 30 * HOUR_MS
    flood = [(BOT, limits, TurnRequest(f"f{i}", "flooder", "g")) for i in range(10)]
    assert [d.outcome for d in await turns.admit(flood, now)][:3] == ["allowed", "noticed", "limited"]
    # The flooder used one of the chat's two turns, not all of them: someone else still gets one.
    (other,) = await turns.admit([(BOT, limits, TurnRequest("o1", "other", "g"))], now)
    assert other.allowed
    (third,) = await turns.admit([(BOT, limits, TurnRequest("t1", "third", "g"))], now)
    assert (third.allowed, third.scope, third.notice) == (False, "chat", True)


async def test_exempt_messages_and_bots_without_limits_ask_redis_nothing(redis_url: str, redis_prefix: str) -> None:
    turns = limiter(redis_url, redis_prefix)
    limits = config(bot_turns={"count": 1, "per_seconds": 60})
    decisions = await turns.admit(
        [
            (BOT, limits, TurnRequest("a", "boss", "g", exempt=True)),
            (BOT, LimitsConfig(), TurnRequest("b", "u", "g")),
            (BOT, limits, TurnRequest("c", "u", "g")),
            (BOT, limits, TurnRequest("d", "u", "g2")),
        ],
        40 * HOUR_MS,
    )
    assert [d.outcome for d in decisions] == ["allowed", "allowed", "allowed", "noticed"]
    keys = await turns.redis.execute("KEYS", f"{redis_prefix}inlimit:*")
    assert len(keys) == 1  # the bot window only: the exempt message and the bot without limits count nowhere
