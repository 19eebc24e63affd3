"""Usage budgets against a real Redis (one server and a Cluster): accounting once per session and
value, the check where a turn would start, and the admins' commands, through ingest's batch step."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from pipeline.controls.budget_store import BudgetStore
from pipeline.controls.budgets import BudgetLimit, Budgets, window_at
from pipeline.controls.usage import UsageBudgets
from pipeline.records import InboundMessage, OutboundMessage, Sender
from pipeline.session.models import UsageSnapshot
from pipeline.settings import BotConfig, Settings
from pipeline.stages.ingest import IngestStage
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.state import State
from pipeline.topics import SESSION_INPUT

from ..stages.test_ingest_admit import Recorder, run

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["redis", "cluster"])
async def state(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[State]:
    url = request.getfixturevalue("redis_cluster").url if request.param == "cluster" else None
    state = State.connect(str(url or request.getfixturevalue("redis_url")), redis_prefix)
    yield state
    await state.redis.aclose()


def bot(**budgets: object) -> BotConfig:
    return BotConfig(
        platform="console", bot_id="demo", self_id="bot", language="en", admins=["boss"], budgets=Budgets(**budgets)
    )


def usage(input_tokens: int, output_tokens: int = 0, seconds: float = 0.0) -> UsageSnapshot:
    return UsageSnapshot(input_tokens=input_tokens, output_tokens=output_tokens, active_seconds=seconds)


async def test_each_sessions_cumulative_usage_is_accounted_once(state: State) -> None:
    budgets = UsageBudgets(state.redis, state.keys, clock=lambda: NOW)
    demo = bot()
    assert await budgets.account(demo, "sesn-1", usage(1000, 200, 3.5), "g", "alice") is not None
    # The same report replayed (a resumed stream), then an older one: nothing more.
    await budgets.account(demo, "sesn-1", usage(1000, 200, 3.5), "g", "alice")
    await budgets.account(demo, "sesn-1", usage(400, 100, 1.0), "g", "alice")
    # The session's next turn: only what it added; another session of the same chat, another user.
    added = await budgets.account(demo, "sesn-1", usage(1500, 300, 5.0), "g", "alice")
    assert (added.tokens, added.active_ms) == (600, 1500)
    await budgets.account(demo, "sesn-2", usage(50), "g", "bob")
    store = BudgetStore(state.redis, state.keys)
    window = window_at(demo.budgets, NOW)
    keys = [
        store.totals_key("console:demo", window, "bot"),
        store.totals_key("console:demo", window, "chat", "g"),
        store.totals_key("console:demo", window, "user", "alice"),
        store.totals_key("console:demo", window, "user", "bob"),
    ]
    totals = await store.totals(keys)
    assert [(t.tokens, t.active_ms) for t in totals] == [(1850, 5000), (1850, 5000), (1800, 5000), (50, 0)]


def message(i: int, text: str, *, user: str = "alice", chat: str = "g", **extra: object) -> InboundMessage:
    return InboundMessage.model_validate(
        {
            "platform": "console",
            "bot_id": "demo",
            "chat_id": chat,
            "chat_type": "group",
            "sender": Sender(user_id=user, name=user),
            "message_id": f"m{i}",
            "text": text,
            "conversation_key": f"console:demo:{chat}",
            "trace_id": f"t{i}",
            **extra,
        }
    )


def ingest_stage(state: State, demo: BotConfig) -> tuple[IngestStage, Recorder]:
    settings = Settings(redis_prefix=state.keys.prefix, bots=[demo])
    recorder = Recorder()
    stage = IngestStage(settings, state, Outputs(recorder), Notifier(settings), lambda b, m, w: None)
    stage.budgets.clock = lambda: NOW
    return stage, recorder


def notices(recorder: Recorder) -> list[str]:
    texts = []
    for topic, _, value in recorder.records:
        if topic.startswith("im.outbound"):
            out = OutboundMessage.model_validate_json(value)
            texts.append(" ".join(s.data.text for s in out.segments if s.type == "text"))
    return texts


async def test_a_spent_budget_starts_no_turn_and_its_sender_hears_so_once(state: State) -> None:
    demo = bot(timezone="Europe/Berlin", per_chat=BudgetLimit(tokens=1000), per_user=BudgetLimit(tokens=5000))
    stage, recorder = ingest_stage(state, demo)
    assert await run(stage, recorder, [message(1, "@bot hi", mentions_bot=True)]) == [True]
    await stage.budgets.account(demo, "sesn-1", usage(900, 150), "g", "alice")  # the turn crossed it
    mentions = [message(i, "@bot again", mentions_bot=True) for i in (2, 3)]
    assert await run(stage, recorder, mentions) == [True, False]
    assert len(recorder.turns()) == 1
    assert notices(recorder) == [
        "This chat has used up its usage budget. I can answer again after 2026-12-07 00:00 (Europe/Berlin)."
    ]
    # Another sender in the same chat hears it once too; another chat is not affected.
    other = message(4, "@bot me?", user="bob", mentions_bot=True)
    elsewhere = message(5, "@bot hello", chat="h", mentions_bot=True)
    assert await run(stage, recorder, [other, elsewhere]) == [True, True]
    assert [t.chat_id for t in recorder.turns()] == ["g", "h"]
    # A replayed refused message is a duplicate (it was marked seen).
    assert await run(stage, recorder, [mentions[1]]) == [False]
    # Commands are never refused: an admin grants more, and the chat's turns start again.
    assert await run(stage, recorder, [message(6, "/grant 2k", user="boss")]) == [True]
    assert notices(recorder)[-1] == "Granted 2000 tokens more to this chat for 2026-12-06."
    assert await run(stage, recorder, [message(7, "@bot and now?", mentions_bot=True)]) == [True]
    assert [t.inbound_ids for t in recorder.turns()][-1] == ["m7"]
    assert [t for t, _, _ in recorder.records].count(SESSION_INPUT) == 3


async def test_usage_and_grant_are_for_admins(state: State) -> None:
    demo = bot(per_user=BudgetLimit(tokens=5000, active_seconds=600))
    stage, recorder = ingest_stage(state, demo)
    await stage.budgets.account(demo, "sesn-1", usage(1200, 0, 30.5), "g", "alice")
    await run(stage, recorder, [message(1, "/usage", user="alice")])
    assert notices(recorder)[-1] == "Only admins may use this command."
    await run(stage, recorder, [message(2, "/grant 1000 @alice", user="boss")])
    await run(stage, recorder, [message(3, "/usage @alice", user="boss")])
    assert (
        notices(recorder)[-1] == "Usage of @alice in 2026-12-06: 1200 / 5000 (+1000) tokens, 30.5 / 600 active seconds."
    )
    await run(stage, recorder, [message(4, "/usage", user="boss")])
    assert notices(recorder)[-1] == "Usage of this chat in 2026-12-06: 1200 tokens, 30.5 active seconds."
    await run(stage, recorder, [message(5, "/grant", user="boss")])
    assert notices(recorder)[-1].startswith("Usage: /grant <amount>")
    # A platform-reported group admin may too; nobody is an admin of a private chat by being in it.
    await run(stage, recorder, [message(6, "/usage", user="carol", sender=Sender(user_id="carol", is_admin=True))])
    assert notices(recorder)[-1].startswith("Usage of this chat")
    assert not any(t for t, _, _ in recorder.records if t == SESSION_INPUT)
