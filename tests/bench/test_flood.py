"""`switchboard bench --flood`: the flooding chat's plan and how its outcome is counted."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pipeline.bench.flood import flood_outcome, flood_plan
from pipeline.bench.load import Delivery, Generator


def test_the_flood_is_one_group_chat_of_triggering_messages_at_the_rate() -> None:
    plan = flood_plan("demo", rate=300, duration=2)
    assert len(plan.messages) == 600 and len(plan.chats) == 1
    assert plan.offsets[:3] == [0.0, 1 / 300, 2 / 300]
    bodies = [json.loads(m.body) for m in plan.messages]
    assert {b["chat_id"] for b in bodies} == {plan.chats[0][0]}
    assert all(b["mentions"] == ["bot"] and b["chat_type"] == "group" for b in bodies)
    assert len({b["message_id"] for b in bodies}) == 600


class _Deliveries:
    def __init__(self, deliveries: list[Delivery]) -> None:
        self._deliveries = deliveries

    async def deliveries(self, bot: str, chat_ids: Sequence[str]) -> list[Delivery]:
        return [d for d in self._deliveries if d.chat_id in chat_ids]


async def test_the_outcome_counts_turns_merged_unanswered_and_notices() -> None:
    plan = flood_plan("demo", rate=10, duration=1)
    chat = plan.chats[0][0]
    ids = [m.msg_id for m in plan.messages]

    def delivery(kind: str, text: str) -> Delivery:
        return Delivery(chat, kind, None, text, {}, 0.0, f"out-{text[:20]}")

    stand_in = _Deliveries(
        [
            delivery("reply", f"echo: msg:{ids[0]} flooding"),
            delivery("reply", " ".join(f"msg:{i}" for i in ids[1:6])),
            delivery("notice", "Slow down."),
        ]
    )
    generator = Generator(plan, list)
    generator.stats.sent = generator.stats.acked = 10
    outcome = await flood_outcome(stand_in, plan, generator)  # type: ignore[arg-type]
    assert (outcome["turns"], outcome["answered"], outcome["merged"]) == (2, 6, 4)
    assert (outcome["not_answered"], outcome["notices"]) == (4, 1)
