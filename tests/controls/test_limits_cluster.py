"""The limits' Redis steps on a Redis Cluster: every key of one script call in one slot (the bot's
for the turn limits, the conversation's for the context quota), so each runs on one node."""

from __future__ import annotations

from pipeline.controls.limits import LimitsConfig, TurnRequest
from pipeline.embedded import RedisCluster
from pipeline.state import InboundAdmission, State
from pipeline.state.limits import TurnLimiter, context_quota


async def test_the_limits_run_on_a_cluster(redis_cluster: RedisCluster, redis_prefix: str) -> None:
    state = State.connect(redis_cluster.url, redis_prefix)
    assert state.redis.cluster
    limits = LimitsConfig.model_validate(
        {
            "user_turns": {"count": 2, "per_seconds": 3600},
            "chat_turns": {"count": 10, "per_seconds": 3600},
            "bot_turns": {"count": 10, "per_seconds": 3600},
            "user_messages": {"count": 2, "per_seconds": 3600},
        }
    )
    try:
        turns = TurnLimiter(state.redis, state.keys)
        requests = [
            (bot, limits, TurnRequest(f"{bot}-m{i}", "alice", f"g{i}")) for bot in ("tg:a", "tg:b") for i in range(3)
        ]
        decisions = await turns.admit(requests, 3_600_000 * 50)
        # Two bots, two script calls (one per bot's slot), each bot's limits its own.
        assert [d.outcome for d in decisions] == ["allowed", "allowed", "noticed"] * 2
        quota = context_quota(limits, "alice", 3_600_000 * 50)
        items = [
            InboundAdmission(f"d{i}", f"tg:a:g{i % 2}", entry_json=b'{"m":1}', mark=True, quota=quota) for i in range(6)
        ]
        results = await state.markers.admit_inbound(items, context_size=10)
        # Per conversation (each in its own slot): the user's first two messages kept, the third not.
        assert [r.unkept for r in results] == [False, False, False, False, True, True]
    finally:
        await state.redis.aclose()
