"""Render accounts a session's `session.usage` only for a bot with usage budgets: a bot without
`[bots.budgets]` costs no Redis call for it. Against a real Redis; what render produces goes to a
recorder at the producer seam."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.controls.budget_store import BudgetStore
from pipeline.controls.budgets import Budgets, window_at
from pipeline.records import Position, SessionEventRecord
from pipeline.runtime import reply_policy
from pipeline.session.models import SessionUsage, UsageSnapshot
from pipeline.settings import BotConfig, Settings
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.render import RenderStage
from pipeline.stages.tools import ImTools
from pipeline.stages.work import run_remaining
from pipeline.state import State

from .turns import Recorder, round_trips


def bot(budgets: Budgets) -> BotConfig:
    return BotConfig(platform="console", bot_id="demo", self_id="bot", budgets=budgets)


async def account(redis_url: str, prefix: str, config: BotConfig) -> tuple[float, int]:
    """A usage report of the chat's session through render: (its round trips, the chat's tokens)."""
    settings = Settings(redis_prefix=prefix, bots=[config])
    state = State.connect(redis_url, settings.redis_prefix)
    try:
        stage = RenderStage(
            settings,
            state,
            Outputs(Recorder()),
            Notifier(settings),
            {(b.platform, b.bot_id): reply_policy(b, settings) for b in settings.bots},
            {},
            ImTools(settings, state.conversations),
        )
        report = SessionEventRecord(
            conversation_key="console:demo:chat-1",
            session_id="s1",
            event=SessionUsage(id="u-1", usage=UsageSnapshot(input_tokens=700, output_tokens=50)),
        )
        before = round_trips()
        (work,) = await stage.admit([report], [Position("session.events", 0, 0)])
        await run_remaining(work)
        calls = round_trips() - before
        store = BudgetStore(state.redis, state.keys)
        window = window_at(config.budgets, datetime.now(UTC))
        (chat,) = await store.totals([store.totals_key("console:demo", window, "chat", "chat-1")])
        return calls, chat.tokens
    finally:
        await state.redis.aclose()


async def test_a_bot_without_budgets_is_not_accounted(redis_url: str, redis_prefix: str) -> None:
    assert await account(redis_url, redis_prefix, bot(Budgets())) == (0, 0)


async def test_a_bot_with_a_budget_is_accounted(redis_url: str, redis_prefix: str) -> None:
    calls, tokens = await account(redis_url, redis_prefix, bot(Budgets(per_chat={"tokens": 10_000})))
    assert calls >= 1
    assert tokens == 750
