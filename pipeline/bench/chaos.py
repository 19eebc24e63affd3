"""Faults under load, then an account of every message that should have been answered.

The stack runs with an AOF Redis (state survives a restart) and a bot with busy policy `queue`
(every triggering message is its own turn, so every message gets exactly one reply whose
`reply_to` is its id and whose echo text carries its token `msg:<id>`). While an open-loop load of
private messages runs, workers are SIGKILLed (a replacement started each time), Redis is
restarted, the simulator drops every SSE stream, answers POST events with 429/500, and accepts
events but answers only after the client's timeout (on a Redis Cluster or behind Sentinel the Redis
fault is the primary SIGKILLed and its replica promoted instead of a restart). Afterwards every
accepted message must have exactly one reply (or one host notice), and the session must have seen
its user message once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pipeline.bench.chaos_kafka import LagWatch, lag_recovery, run_broker_faults
from pipeline.bench.chaos_onebot import BOT_ID as ONEBOT_BOT_ID
from pipeline.bench.chaos_onebot import BOT_TOML as ONEBOT_BOT_TOML
from pipeline.bench.chaos_onebot import OneBotLane, dead_lettered_by_the_session_api, dead_lettered_outcome_unknown
from pipeline.bench.load import Delivery, Generator, Plan, Sent, TrafficMix, build_plan, read_deliveries
from pipeline.bench.measure import wait_idle
from pipeline.bench.runner import BenchStack, log, start_stack
from pipeline.embedded import KafkaCluster, SentinelTopology
from pipeline.records import conversation_key
from pipeline.stack import SIM_API_KEY
from pipeline.topics import DEADLETTER, cluster_specs


@dataclass
class ChaosConfig:
    duration: float = 90.0  # seconds of load
    rate: float = 20.0  # messages/s
    chats: int = 40
    think: float = 0.5  # simulator default think time (turns are in flight when a worker dies)
    workers: int = 2
    kill_every: float = 10.0  # 0: no kills
    redis_restarts: int = 1
    drop_streams: int = 3
    api_faults: bool = True  # 429 / 500 window
    accept_delay: bool = True  # accept-then-delay window (longer than the client timeout)
    broker: str = "tansu"
    # or "cluster" (a Redis Cluster) or "sentinel" (primary + replica + 3 sentinels): on both the
    # "restart" is the primary SIGKILLed and its replica promoted
    redis: str = "single"
    partitions: int = 4
    settle_timeout: float = 120.0
    quiet: float = 8.0
    late_after: float = 30.0  # seconds from the intended send: an answer later than this is late
    seed: int = 7
    run_dir: Path | None = None
    session_timeout: float = 3.0
    kill_in_accept_delay: bool = True  # also SIGKILL a worker while its sends wait on the delayed answers
    burst_prob: float = 0.05
    # The long-connection lane: OneBot messages/s over reverse WebSocket (0: none; chaos_onebot.py).
    onebot_rate: float = 2.0
    # A replicated Apache Kafka cluster of this many nodes instead of `broker` (0: none), and the
    # broker faults to run on it in order ("leader", "rolling"; chaos_kafka.py).
    kafka_nodes: int = 0
    broker_faults: tuple[str, ...] = ()
    broker_faults_at: float = 0.25  # the first broker fault, as a fraction of `duration`
    broker_down_for: float = 15.0  # seconds the killed leader stays down


@dataclass
class FaultLog:
    t0: float
    events: list[dict[str, Any]] = field(default_factory=list)
    background: list[asyncio.Task[None]] = field(default_factory=list)

    def add(self, fault: str, **detail: Any) -> None:
        entry = {"t": round(time.monotonic() - self.t0, 2), "at_ms": round(time.time() * 1000), "fault": fault}
        entry.update(detail)
        self.events.append(entry)
        log(f"chaos: {fault} {detail if detail else ''}")


async def _sim_post(bs: BenchStack, path: str, body: dict[str, Any]) -> Any:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{bs.sim_url}{path}", json=body)
        return response.json()


async def _kill_loop(bs: BenchStack, cfg: ChaosConfig, faults: FaultLog, stop: asyncio.Event) -> None:
    assert bs.stack is not None
    rng = random.Random(cfg.seed)
    n = 0
    while not stop.is_set():
        n += 1  # kills on a fixed schedule (every kill_every s from the start), whatever a start took
        wait = faults.t0 + n * cfg.kill_every - time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(wait, 0.5))
        if stop.is_set():
            break
        await _kill_one(bs, faults, rng, "sigkill_worker")


async def _kill_one(bs: BenchStack, faults: FaultLog, rng: random.Random, label: str) -> None:
    """SIGKILL one running worker, then start a replacement (and wait until it is healthy)."""
    assert bs.stack is not None
    alive = [w for w in bs.stack.workers if w.is_running]
    if not alive:
        faults.add(f"{label}_skipped", reason="no worker alive")
        return
    victim = rng.choice(alive)
    pid = victim.pid
    await victim.kill()
    faults.add(label, pid=pid, log=str(victim.log_path))
    try:
        new = await bs.stack.add_worker()
        faults.add("replacement_ready", pid=new.pid, log=str(new.log_path))
    except Exception as exc:  # keep going: the report says it
        faults.add("replacement_failed", error=repr(exc)[:300])


async def _other_faults(bs: BenchStack, cfg: ChaosConfig, faults: FaultLog) -> None:
    d = cfg.duration
    schedule: list[tuple[float, str]] = []
    for i in range(cfg.drop_streams):
        schedule.append((d * (0.15 + 0.3 * i), "drop_streams"))
    if cfg.api_faults:
        schedule += [(d * 0.25, "api_faults_on"), (d * 0.40, "api_faults_off")]
    for i in range(cfg.redis_restarts):
        schedule.append((d * (0.47 + 0.2 * i), "redis_restart"))
    if cfg.accept_delay:
        schedule += [(d * 0.60, "accept_delay_on"), (d * 0.68, "accept_delay_off")]
    schedule.sort()
    for at, what in schedule:
        delay = faults.t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            if what == "drop_streams":
                out = await _sim_post(bs, "/_sim/drop_streams", {})
                faults.add("drop_streams", dropped=out.get("dropped"))
            elif what == "api_faults_on":
                await _sim_post(bs, "/_sim/faults", {"rate_429": 0.2, "rate_500": 0.1, "retry_after": 0.2, "seed": 3})
                faults.add("session_api_429_500_on", rate_429=0.2, rate_500=0.1)
            elif what == "api_faults_off":
                await _sim_post(bs, "/_sim/faults", {"rate_429": 0.0, "rate_500": 0.0})
                faults.add("session_api_429_500_off")
            elif what == "accept_delay_on":
                delay_s = cfg.session_timeout + 1.0
                await _sim_post(bs, "/_sim/faults", {"accept_delay": delay_s})
                faults.add("accept_then_delay_on", accept_delay=delay_s, client_timeout=cfg.session_timeout)
                if cfg.kill_in_accept_delay:
                    await asyncio.sleep(delay_s * 0.6)
                    faults.background.append(
                        asyncio.create_task(
                            _kill_one(bs, faults, random.Random(cfg.seed + 1), "sigkill_worker_during_accept_delay")
                        )
                    )
            elif what == "accept_delay_off":
                await _sim_post(bs, "/_sim/faults", {"accept_delay": 0.0})
                faults.add("accept_then_delay_off")
            elif what == "redis_restart" and bs.redis_cluster is not None:
                # A cluster loses a primary instead: SIGKILLed, its replica promoted by the cluster.
                t = time.monotonic()
                victim = (await bs.redis_cluster.primaries())[0]
                await bs.redis_cluster.kill(victim)
                faults.add("redis_primary_sigkill", port=victim.port)
                promoted = await bs.redis_cluster.wait_promoted(victim)
                faults.add("redis_replica_promoted", port=promoted.port, seconds=round(time.monotonic() - t, 2))
            elif what == "redis_restart" and bs.redis_sentinel is not None:
                await _sentinel_failover(bs.redis_sentinel, faults)
            elif what == "redis_restart":
                assert bs.redis_server is not None
                t = time.monotonic()
                await bs.redis_server.restart()
                faults.add("redis_restart", seconds=round(time.monotonic() - t, 2), aof=bs.redis_server.aof)
        except Exception as exc:
            faults.add(f"{what}_failed", error=repr(exc)[:300])


async def _sentinel_failover(topology: SentinelTopology, faults: FaultLog) -> None:
    """Behind Sentinel: the primary SIGKILLed, the replica promoted by the sentinels; the killed server
    then started again in the background (the schedule goes on) as the new primary's replica, as a
    supervised node restarts, so a later fault has one to promote."""
    t = time.monotonic()
    victim = await topology.kill_primary()
    faults.add("redis_primary_sigkill", port=victim.port)
    promoted = await topology.wait_promoted(victim)
    faults.add("redis_replica_promoted", port=promoted.port, seconds=round(time.monotonic() - t, 2))

    async def rejoin() -> None:
        t = time.monotonic()
        try:
            await topology.rejoin(victim)
        except Exception as exc:
            faults.add("redis_rejoin_failed", port=victim.port, error=repr(exc)[:300])
            return
        faults.add("redis_rejoined_as_replica", port=victim.port, seconds=round(time.monotonic() - t, 2))

    faults.background.append(asyncio.create_task(rejoin()))


async def session_user_messages(bs: BenchStack, chat_ids: list[str], bot: str) -> dict[str, Any]:
    """Per chat: the session the conversation maps to and the `msg:<id>` tokens of its user.messages."""
    from pipeline.bench.load import TOKEN_RE

    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=20, headers={"x-api-key": SIM_API_KEY}) as http:
        for chat in chat_ids:
            sid = await bs.redis.get(bs.keys.session_of(conversation_key("console", bot, chat)))
            if not sid:
                out[chat] = {"session_id": None, "tokens": []}
                continue
            tokens: list[str] = []
            user_messages = 0
            page = None
            while True:
                params: dict[str, Any] = {"limit": 1000}
                if page:
                    params["page"] = page
                response = await http.get(f"{bs.sim_url}/v1/sessions/{sid}/events", params=params)
                if response.status_code != 200:
                    break
                body = response.json()
                for event in body["data"]:
                    if event.get("type") == "user.message":
                        user_messages += 1
                        text = "".join(b.get("text", "") for b in event.get("content") or [] if b.get("type") == "text")
                        tokens.extend(TOKEN_RE.findall(text))
                page = body.get("next_page")
                if not page:
                    break
            out[chat] = {"session_id": sid, "tokens": tokens, "user_messages": user_messages}
    return out


def account(
    plan: Plan, deliveries: list[Delivery], sessions: dict[str, Any] | None, *, late_after: float
) -> dict[str, Any]:
    """Exactly one answer (reply or notice) per accepted triggering message; each posted once."""
    sent_by_id = {s.msg_id: s for s in plan.messages}
    answers: dict[str, list[Delivery]] = defaultdict(list)
    unattributed: dict[str, list[Delivery]] = defaultdict(list)
    misthreaded: list[dict[str, Any]] = []
    empty_replies: list[dict[str, Any]] = []
    for d in deliveries:
        # The echo text names what the agent answered (ground truth); reply_to only the threading.
        ids = {t for t in d.tokens if t in sent_by_id}
        if ids and d.reply_to in sent_by_id and d.reply_to not in ids:
            misthreaded.append({"outbound_id": d.outbound_id, "reply_to": d.reply_to, "answers": sorted(ids)})
        if not ids and d.reply_to and d.reply_to in sent_by_id:
            ids.add(d.reply_to)
            if d.kind == "reply":
                empty_replies.append({"outbound_id": d.outbound_id, "reply_to": d.reply_to, "text": d.text[:200]})
        if not ids:
            unattributed[d.chat_id].append(d)
        for i in ids:
            answers[i].append(d)
    expected = [s for s in plan.messages if s.triggers and s.acked_ms]
    not_accepted = [s for s in plan.messages if s.triggers and not s.acked_ms]
    # Notifier that name no message (render's notices carry no reply_to): they answer, in order, the
    # oldest unanswered messages of their chat.
    by_notice = 0
    for chat, chat_notices in unattributed.items():
        waiting = sorted(
            (s for s in expected if s.chat_id == chat and not answers.get(s.msg_id)), key=lambda s: s.intended_ms
        )
        for s, d in zip(waiting, sorted(chat_notices, key=lambda d: d.delivered_at), strict=False):
            answers[s.msg_id].append(d)
            by_notice += 1
    lost = [s for s in expected if not answers.get(s.msg_id)]
    duplicated = [s for s in expected if len({d.outbound_id for d in answers.get(s.msg_id, [])}) > 1]
    redelivered = [
        s for s in expected if len(answers.get(s.msg_id, [])) > len({d.outbound_id for d in answers[s.msg_id]})
    ]
    late = []
    for s in expected:
        got = answers.get(s.msg_id)
        if got and min(d.delivered_at for d in got) - s.intended_ms > late_after * 1000:
            late.append(s)
    notices = sum(1 for d in deliveries if d.kind == "notice")
    out: dict[str, Any] = {
        "messages_sent": len(plan.messages),
        "triggering_accepted": len(expected),
        "triggering_never_accepted": len(not_accepted),
        "replies": sum(1 for d in deliveries if d.kind == "reply"),
        "notices": notices,
        "answered_by_unattributed_notice": by_notice,
        "unattributed_left_over": sum(len(v) for v in unattributed.values()) - by_notice,
        "lost": len(lost),
        "duplicated": len(duplicated),
        "redelivered_same_outbound_id": len(redelivered),
        "redelivered_detail": [
            {
                "msg_id": s.msg_id,
                "outbound_ids": sorted({d.outbound_id for d in answers[s.msg_id]}),
                "delivered_at": sorted(d.delivered_at for d in answers[s.msg_id]),
            }
            for s in redelivered[:30]
        ],
        "late": len(late),
        "late_after_s": late_after,
        "misthreaded": len(misthreaded),
        "misthreaded_detail": misthreaded[:30],
        "replies_without_echo": len(empty_replies),
        "replies_without_echo_detail": empty_replies[:30],
        "lost_ids": [s.msg_id for s in lost][:2000],
        "answered_ids": sorted(i for i, v in answers.items() if v),
        "lost_by_chat": dict(sorted(Counter(s.chat_id for s in lost).items())),
        "duplicated_detail": [
            {
                "msg_id": s.msg_id,
                "chat": s.chat_id,
                "answers": [
                    {"id": d.outbound_id, "kind": d.kind, "text": d.text[:120], "delivered_at": d.delivered_at}
                    for d in answers[s.msg_id]
                ],
            }
            for s in duplicated
        ][:50],
    }
    first = [min(d.delivered_at for d in answers[s.msg_id]) - s.intended_ms for s in expected if answers.get(s.msg_id)]
    if first:
        first.sort()
        out["answer_latency_ms"] = {
            "p50": round(first[len(first) // 2]),
            "p99": round(first[max(0, int(len(first) * 0.99) - 1)]),
            "max": round(first[-1]),
        }
    posted_twice: list[dict[str, Any]] = []
    missing_in_session: list[str] = []
    if sessions is not None:
        seen: dict[str, int] = defaultdict(int)
        for info in sessions.values():
            for token in info.get("tokens", []):
                seen[token] += 1
        for s in expected:
            n = seen.get(s.msg_id, 0)
            if n > 1:
                posted_twice.append({"msg_id": s.msg_id, "chat": s.chat_id, "times": n})
            elif n == 0:
                missing_in_session.append(s.msg_id)
    out["posted_twice"] = len(posted_twice)
    out["posted_twice_detail"] = posted_twice[:50]
    out["not_in_mapped_session"] = len(missing_in_session)
    out["not_in_mapped_session_ids"] = missing_in_session[:50]
    return out


def _log_lines(bs: BenchStack, needles: list[str], limit: int = 30) -> list[str]:
    if bs.run_dir is None:
        return []
    lines: list[str] = []
    for path in sorted(bs.run_dir.glob("worker*/*.log")):
        try:
            for line in path.read_text(errors="replace").splitlines():
                if any(n in line for n in needles):
                    lines.append(f"{path.parent.name}: {line[:400]}")
                    if len(lines) >= limit:
                        return lines
        except OSError:
            continue
    return lines


async def _evidence(bs: BenchStack, plan: Plan, acc: dict[str, Any], faults: FaultLog) -> dict[str, Any]:
    """For lost/duplicated messages: when sent, the faults around it, the chat's Redis state, log lines."""
    sent_by_id = {s.msg_id: s for s in plan.messages}
    ids = (
        acc["lost_ids"][:8]
        + [d["msg_id"] for d in acc["duplicated_detail"][:8]]
        + [d["msg_id"] for d in acc["posted_twice_detail"][:8]]
    )
    messages = []
    for msg_id in dict.fromkeys(ids):
        s: Sent = sent_by_id[msg_id]
        near = [f for f in faults.events if abs(f["at_ms"] - s.intended_ms) <= 15_000]
        messages.append(
            {
                "msg_id": msg_id,
                "chat": s.chat_id,
                "intended_ms": round(s.intended_ms),
                "acked_ms": round(s.acked_ms),
                "attempts": s.attempts,
                "faults_within_15s": near,
                "worker_log": _log_lines(bs, [msg_id, f"console:queue:{s.chat_id}"], 20),
            }
        )
    chats: dict[str, Any] = {}
    p, keys = bs.redis_prefix, bs.keys
    for chat in list(acc.get("lost_by_chat", {}))[:10]:
        conv = conversation_key("console", "queue", chat)
        with contextlib.suppress(Exception):
            chats[chat] = {
                "conv": await bs.redis.hgetall(keys.conversation(conv)),
                "held": await bs.redis.lrange(keys.held(conv), 0, -1),
                "session": await bs.redis.get(keys.session_of(conv)),
            }
            for key in ("held",):
                chats[chat][key] = [h[:300] for h in chats[chat][key]][:5] + (
                    [f"... {len(chats[chat][key])} held"] if chats[chat][key] else []
                )
    async with httpx.AsyncClient(timeout=10, headers={"x-api-key": SIM_API_KEY}) as http:
        for info in chats.values():
            sid = info.get("session")
            if not sid:
                continue
            with contextlib.suppress(Exception):
                info["sim_session_status"] = (await http.get(f"{bs.sim_url}/v1/sessions/{sid}")).json().get("status")
                last = (
                    await http.get(f"{bs.sim_url}/v1/sessions/{sid}/events", params={"limit": 8, "order": "desc"})
                ).json()["data"]
                info["sim_last_events"] = [
                    {
                        "id": e.get("id"),
                        "type": e.get("type"),
                        "text": "".join(b.get("text", "") for b in e.get("content") or [] if isinstance(b, dict))[:60],
                    }
                    for e in last
                ]
    answered = set(acc.get("answered_ids", []))
    for info in chats.values():
        with contextlib.suppress(Exception):
            turn = json.loads(info.get("conv", {}).get("turn") or "{}")
            info["turn_reply_to"] = turn.get("reply_to_message_id")
            info["turn_reply_to_answered"] = turn.get("reply_to_message_id") in answered
    inflight = {}
    with contextlib.suppress(Exception):
        for key in await bs.redis.keys(f"{p}inflight:*"):
            inflight[key] = await bs.redis.hgetall(key)
    return {"messages": messages, "chat_state": chats, "inflight": inflight}


async def run_chaos(cfg: ChaosConfig, bs: BenchStack | None = None) -> dict[str, Any]:
    own = bs is None
    if bs is None:
        redis = {
            "cluster": "an AOF Redis Cluster (3 primaries + 3 replicas)",
            "sentinel": "AOF Redis behind Sentinel (primary + replica + 3 sentinels)",
        }.get(cfg.redis, "an AOF Redis")
        log(f"chaos: starting a stack on {cfg.broker} with {redis} and {cfg.workers} workers")
        bs = await start_stack(
            broker=cfg.broker,
            workers=cfg.workers,
            think=cfg.think,
            aof=True,
            run_dir=cfg.run_dir,
            partitions=cfg.partitions,
            log_level="INFO",
            extra_env={"SWITCHBOARD_SESSION_TIMEOUT_SECONDS": str(cfg.session_timeout)},
            extra_bots=ONEBOT_BOT_TOML if cfg.onebot_rate > 0 else "",
            redis=cfg.redis,
            kafka_nodes=cfg.kafka_nodes,
        )
    try:
        return await _run(bs, cfg)
    finally:
        if own:
            await bs.close()


async def _run(bs: BenchStack, cfg: ChaosConfig) -> dict[str, Any]:
    mix = TrafficMix(
        conversations=cfg.chats,
        private_share=1.0,
        filtered_share=0.0,
        burst_prob=cfg.burst_prob,
        burst_size=3,
        bot="queue",
        think=None,
    )
    plan = build_plan(mix, cfg.rate, cfg.duration, seed=cfg.seed)
    gen = Generator(plan, bs.urls, retries=120, retry_delay=0.5, timeout=15)
    faults = FaultLog(t0=time.monotonic())
    log(
        f"chaos: {len(plan.messages)} messages into {cfg.chats} chats at {cfg.rate}/s for {cfg.duration}s; "
        f"run dir {bs.run_dir}"
    )
    gen.start()
    lane = OneBotLane(cfg.onebot_rate) if cfg.onebot_rate > 0 and _has_onebot_bot(bs) else None
    if lane is not None:
        lane.start(bs.urls)
    try:
        return await _under_faults(bs, cfg, plan, gen, faults, lane)
    finally:
        if lane is not None:
            await lane.close()


def _has_onebot_bot(bs: BenchStack) -> bool:
    return bs.stack is not None and bs.stack.settings().bot("onebot", ONEBOT_BOT_ID) is not None


async def _under_faults(
    bs: BenchStack, cfg: ChaosConfig, plan: Plan, gen: Generator, faults: FaultLog, lane: OneBotLane | None
) -> dict[str, Any]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_other_faults(bs, cfg, faults))]
    if cfg.kill_every > 0:
        tasks.append(asyncio.create_task(_kill_loop(bs, cfg, faults, stop)))
    broker = _BrokerFaults.start(bs, cfg, faults) if cfg.broker_faults else None
    last_print = 0.0
    while not gen.stats.done:
        await asyncio.sleep(0.5)
        if time.monotonic() - last_print >= 1.0:
            last_print = time.monotonic()
            log(
                f"[chaos {time.monotonic() - faults.t0:5.0f}s] sent {gen.stats.sent} accepted {gen.stats.acked} "
                f"webhook errors {gen.stats.errors} workers alive {len(bs.urls())}"
            )
    stop.set()
    if lane is not None:
        await lane.stop_traffic()
    tasks[0].cancel()  # scheduled faults not reached yet are skipped; a replacement being started is awaited
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*faults.background, return_exceptions=True)
    if broker is not None:
        await broker.finish_faults()  # every node back and in sync before the settle
    with contextlib.suppress(Exception):
        await _sim_post(bs, "/_sim/faults", {"rate_429": 0.0, "rate_500": 0.0, "accept_delay": 0.0})
    assert bs.stack is not None
    if not bs.urls():
        await bs.stack.add_worker()
    # -- settle: until every accepted message is answered and nothing new arrives for a while ------------
    # While anything is unanswered the run waits up to `settle_timeout` (a late answer is late, not
    # lost); it gives up sooner only once nothing at all has arrived for `quiet`·6 s.
    expected = [s for s in plan.messages if s.triggers and s.acked_ms]
    chats = [c for c, _ in plan.chats]
    deadline = time.monotonic() + cfg.settle_timeout
    last_n, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        deliveries = await read_deliveries(bs.redis, bs.keys, "queue", chats)
        acc = account(plan, deliveries, None, late_after=cfg.late_after)
        n = len(deliveries) + (lane.replies_received() if lane is not None else 0)
        if n != last_n:
            last_n, stable_since = n, time.monotonic()
        unanswered = lane.unanswered() if lane is not None else 0
        log(
            f"[chaos settle] deliveries {len(deliveries)} of {len(expected)} expected; lost so far {acc['lost']}"
            + (f"; onebot unanswered {unanswered}" if lane is not None else "")
        )
        if acc["lost"] == 0 and unanswered == 0:
            break
        if time.monotonic() - stable_since >= cfg.quiet * 6:
            break
        await asyncio.sleep(1.0)
    # A duplicate would come from work still in flight: once every worker has none, the count is
    # final (a worker that never gets idle is waited for as long as a quiet spell, then counted).
    with contextlib.suppress(TimeoutError):
        await wait_idle(bs.urls, quiet=1.0, timeout=cfg.quiet * 6)
    deliveries = await read_deliveries(bs.redis, bs.keys, "queue", chats)
    sessions = await session_user_messages(bs, chats, "queue")
    acc = account(plan, deliveries, sessions, late_after=cfg.late_after)
    sim_stats = {}
    with contextlib.suppress(Exception):
        async with httpx.AsyncClient(timeout=5) as http:
            sim_stats = (await http.get(f"{bs.sim_url}/_sim/stats")).json()
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "run_dir": str(bs.run_dir),
        "faults": faults.events,
        "kills": sum(
            1 for f in faults.events if f["fault"] in ("sigkill_worker", "sigkill_worker_during_accept_delay")
        ),
        # Workers that ended without our SIGKILL (a crash): none should.
        "workers_exited": [
            {"pid": w.pid, "exit_code": w.exit_code, "log": str(w.log_path)}
            for w in bs.stack.workers
            if not w.is_running and w.exit_code != -signal.SIGKILL
        ],
        "accounting": acc,
        "webhook": {"errors": gen.stats.errors, "failed": gen.stats.failed},
        "sim_stats": {k: v for k, v in sim_stats.items() if k != "faults"},
    }
    if broker is not None:
        result["kafka_cluster"] = await broker.report()
    if acc["lost"] or acc["duplicated"] or acc["posted_twice"]:
        result["evidence"] = await _evidence(bs, plan, acc, faults)
    log(
        f"chaos: {result['kills']} kills; accepted {acc['triggering_accepted']}, replies {acc['replies']}, "
        f"notices {acc['notices']}; lost {acc['lost']} duplicated {acc['duplicated']} late {acc['late']} "
        f"posted twice {acc['posted_twice']}"
    )
    if lane is not None:
        unknown: set[int] = set()
        noticed: set[int] = set()
        try:
            unknown = await dead_lettered_outcome_unknown(bs.bootstrap)
            noticed = await dead_lettered_by_the_session_api(bs.bootstrap)
        except Exception as exc:  # the report says so; the messages count as lost
            log(f"chaos onebot ws: the dead-letter topic could not be read: {exc!r}")
        ob = result["onebot_ws"] = lane.account(late_after=cfg.late_after, outcome_unknown=unknown, noticed=noticed)
        log(
            f"chaos onebot ws: {ob['written_to_a_socket']} written, {ob['answered']} answered, "
            f"{ob['answered_by_notice']} by a notice (the session API refused them); lost {ob['lost']} "
            f"(in a dead socket {ob['lost_in_dead_socket']}, outcome unknown {ob['outcome_unknown']}) "
            f"duplicated {ob['duplicated']} late {ob['late']}; {ob['sockets']} sockets"
        )
    return result


@dataclass
class _BrokerFaults:
    """The broker faults of a run on a `KafkaCluster`, and the lag watch that times their recovery."""

    cluster: KafkaCluster
    watch: LagWatch
    faults_task: asyncio.Task[list[dict[str, Any]]]
    watch_task: asyncio.Task[None]
    stop_watch: asyncio.Event
    windows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def start(cls, bs: BenchStack, cfg: ChaosConfig, faults: FaultLog) -> _BrokerFaults:
        if bs.cluster is None:
            raise ValueError("broker faults need the stack on a Kafka cluster (ChaosConfig.kafka_nodes)")
        assert bs.stack is not None
        # The topics the workers consume (the dead letters are written only on bad input).
        topics = [s.name for s in cluster_specs(bs.stack.settings()) if s.name != DEADLETTER]
        watch = LagWatch(bs.bootstrap, bs.app_id, topics, faults.t0)
        stop_watch = asyncio.Event()
        return cls(
            cluster=bs.cluster,
            watch=watch,
            faults_task=asyncio.create_task(
                run_broker_faults(
                    bs.cluster,
                    cfg.broker_faults,
                    topics,
                    faults.add,
                    t0=faults.t0,
                    start_at=cfg.duration * cfg.broker_faults_at,
                    down_for=cfg.broker_down_for,
                )
            ),
            watch_task=asyncio.create_task(watch.run(stop_watch)),
            stop_watch=stop_watch,
        )

    async def finish_faults(self) -> None:
        try:
            self.windows = await self.faults_task
        except Exception as exc:  # the report says it; the accounting still runs
            self.error = repr(exc)[:500]
            log(f"chaos: broker faults failed: {self.error}")

    async def report(self) -> dict[str, Any]:
        self.stop_watch.set()
        await self.watch_task
        normal = lag_recovery(self.watch.samples, self.windows)
        for w in self.windows:
            if w["fault"] == "leader":
                log(
                    f"chaos kafka: SIGKILL of node {w['node']} (leader of {w['partitions_led']} of "
                    f"{w['partitions']} partitions): leaders moved in {w['leaders_moved_s']} s; down "
                    f"{w['down_s']} s, restart {w['restart_s']} s, in sync {w['in_sync_after_restart_s']} s "
                    f"later; lag max {w['max_lag']}, normal (<= {normal['normal_lag_bound']}) again "
                    f"{w['lag_normal_again_s']} s after the kill, for good after {w['lag_recovered_s']} s"
                )
            else:
                log(
                    f"chaos kafka: rolling restart {w['nodes']}: {w['end_s'] - w['start_s']:.1f} s; lag max "
                    f"{w['max_lag']}, normal (<= {normal['normal_lag_bound']}) for good {w['lag_recovered_s']} s "
                    "after it began"
                )
        return {
            "nodes": len(self.cluster.nodes),
            "faults": self.windows,
            "error": self.error,
            **normal,
            "lag_samples": self.watch.samples,
        }
