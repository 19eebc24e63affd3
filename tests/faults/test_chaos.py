"""Faults under load (SIGKILLed workers, Redis restart or, on a Redis Cluster or behind Sentinel, a
primary SIGKILLed and its replica promoted, SSE drops, 429/500, accept-then-delay):
every accepted message that triggers the agent gets exactly one answer, and its user message is
posted to the session once; so does every message of a OneBot bot on reverse WebSocket that reached
a socket. All on loopback; about two minutes.

The accounting itself is checked on synthetic deliveries first (it must catch a loss and a
duplicate, or the end-to-end test below would prove nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.bench.chaos import ChaosConfig, account
from pipeline.bench.load import Delivery, Plan, Sent, TrafficMix, build_plan
from tests.conftest import enabled_brokers

from .chaos_run import assert_answered_exactly_once, run_chaos_for_test


def _plan() -> Plan:
    plan = build_plan(TrafficMix(conversations=3, private_share=1.0, burst_prob=0.0, bot="queue"), 10, 1, seed=1)
    for i, s in enumerate(plan.messages):
        s.intended_ms = 1000.0 + i
        s.acked_ms = 1001.0 + i
    return plan


def _reply(s: Sent, outbound_id: str, **over: Any) -> Delivery:
    base: dict[str, Any] = dict(
        chat_id=s.chat_id,
        kind="reply",
        reply_to=s.msg_id,
        text=f"echo: msg:{s.msg_id} x",
        hops={},
        delivered_at=s.intended_ms + 500,
        outbound_id=outbound_id,
    )
    base.update(over)
    return Delivery(**base)


def test_accounting_counts_exactly_once() -> None:
    plan = _plan()
    deliveries = [_reply(s, f"out-{s.msg_id}") for s in plan.messages]
    sessions = {c: {"tokens": [s.msg_id for s in plan.messages if s.chat_id == c]} for c, _ in plan.chats}
    acc = account(plan, deliveries, sessions, late_after=30)
    assert (acc["lost"], acc["duplicated"], acc["posted_twice"], acc["late"]) == (0, 0, 0, 0)


def test_accounting_catches_loss_duplicate_double_post_and_lateness() -> None:
    plan = _plan()
    first, second, third, fourth = plan.messages[:4]
    deliveries = [_reply(s, f"out-{s.msg_id}") for s in plan.messages[2:]]  # first, second: lost
    deliveries.append(_reply(third, "out-other"))  # a second, different reply: duplicated
    deliveries.append(_reply(fourth, f"out-{fourth.msg_id}-late", delivered_at=fourth.intended_ms + 60_000))
    sessions = {"all": {"tokens": [s.msg_id for s in plan.messages] + [third.msg_id]}}
    acc = account(plan, deliveries, sessions, late_after=30)
    assert acc["lost"] == 2 and set(acc["lost_ids"]) == {first.msg_id, second.msg_id}
    assert acc["duplicated"] == 2  # third (two replies) and fourth (on time + late)
    assert acc["posted_twice"] == 1
    # a host notice without reply_to answers the oldest unanswered message of its chat
    notice = Delivery(
        chat_id=first.chat_id,
        kind="notice",
        reply_to=None,
        text="Something went wrong",
        hops={},
        delivered_at=first.intended_ms + 10,
        outbound_id="notice-1",
    )
    acc = account(plan, [*deliveries, notice], None, late_after=30)
    assert acc["lost"] == 1 and acc["answered_by_unattributed_notice"] == 1


def test_accounting_catches_the_same_reply_delivered_twice() -> None:
    plan = _plan()
    deliveries = [_reply(s, f"out-{s.msg_id}") for s in plan.messages]
    first = plan.messages[0]
    deliveries.append(_reply(first, f"out-{first.msg_id}", delivered_at=first.intended_ms + 500))  # replayed send
    acc = account(plan, deliveries, None, late_after=30)
    assert acc["duplicated"] == 0 and acc["redelivered_same_outbound_id"] == 1
    assert acc["redelivered_detail"][0]["msg_id"] == first.msg_id
    assert len(acc["redelivered_detail"][0]["delivered_at"]) == 2


@pytest.mark.integration
@pytest.mark.parametrize("redis", ["single", "cluster", "sentinel"])
@pytest.mark.parametrize(
    "broker",
    # Each enabled broker (SWITCHBOARD_TEST_BROKERS), like the other integration tests: the run
    # starts its own. Apache Kafka gets longer: its JVM boots inside the run.
    [pytest.param(b, marks=pytest.mark.timeout(230 if b == "tansu" else 330)) for b in enabled_brokers()],
)
async def test_no_reply_lost_or_duplicated_under_faults(tmp_path: Path, redis: str, broker: str) -> None:
    """`cluster`: the stack on a Redis Cluster (3 primaries + 3 replicas); `sentinel`: on a primary,
    a replica and three sentinels (the workers on the `redis+sentinel://` URL). On both the Redis
    fault is the primary SIGKILLed under load and its replica promoted, instead of a restart; behind
    Sentinel the killed server then rejoins as the new primary's replica.

    Every message is accepted (none allowed to go missing at the door: see
    `assert_answered_exactly_once` for why the count is exact) and answered once."""
    cfg = ChaosConfig(
        duration=60,
        rate=15,
        chats=30,
        think=0.5,
        workers=2,
        kill_every=12,
        redis_restarts=1,
        drop_streams=2,
        broker=broker,
        redis=redis,
        settle_timeout=60,
        quiet=6,
        run_dir=tmp_path / "stack",
    )
    result, detail = await run_chaos_for_test(cfg, tmp_path)
    assert result["workers_exited"] == [], detail  # a worker that crashed on a fault
    assert result["kills"] >= 3, detail
    faults = [f["fault"] for f in result["faults"]]
    if redis == "single":
        assert "redis_restart" in faults, detail
    else:
        assert "redis_primary_sigkill" in faults and "redis_replica_promoted" in faults, detail
    if redis == "sentinel":  # the killed server back, a replica again: a later fault has one to promote
        assert "redis_rejoined_as_replica" in faults, detail
    assert_answered_exactly_once(result, detail)
    # The long-connection lane: a OneBot bot on reverse WebSocket, its holder among the killed.
    onebot = result["onebot_ws"]
    assert onebot["written_to_a_socket"] >= 0.8 * onebot["messages_sent"] and onebot["sockets"] >= 2, onebot
    assert onebot["lost"] == 0 and onebot["duplicated"] == 0, onebot
    # A reply its holder wrote just before a SIGKILL is not sent again (OneBot cannot tell a repeat):
    # at most one per kill of the holder, dead-lettered, never silently gone.
    assert onebot["outcome_unknown"] <= result["kills"], onebot
