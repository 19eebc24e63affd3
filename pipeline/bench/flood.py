"""`switchboard bench --flood`: fairness under a flood.

The same normal traffic twice, on the same stack and conversations: once alone, once beside one
group chat that sends `--flood-rate` triggering messages a second (every one mentions the bot). The
figure is the other chats' pipeline overhead (end to end minus the agent's time) p50 and p99 with
the flood, as a ratio of the same without it; the target is at most 1.5. The flooding chat's
outcome says what became of its messages: answered in turns of their own, merged into another
message's turn, not answered (held, limited or dropped), and the notices it got.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import uuid
from typing import Any

import httpx

from pipeline.bench.load import Generator, Plan, Sent, TrafficMix
from pipeline.bench.measure import TLS, scrape_metrics, wait_idle
from pipeline.bench.runner import BenchStack, PhaseResult, log, run_phase

TARGET_RATIO = 1.5
# `--flood-limit`: the bot both phases use, its chats under a turn limit.
LIMITED_BOT = "limited"


def limited_bot_toml(limit: str) -> str:
    """The bots-file entry of `LIMITED_BOT` for `--flood-limit COUNT/SECONDS`."""
    count, _, seconds = limit.partition("/")
    try:
        n, per = int(count), int(seconds)
    except ValueError:
        raise SystemExit(f"--flood-limit {limit!r}: expected COUNT/SECONDS, e.g. 20/10") from None
    return f"""
[[bots]]
platform = "console"
bot_id = "{LIMITED_BOT}"
self_id = "bot"
language = "en"
busy_policy = "merge"
[bots.limits]
chat_turns = {{ count = {n}, per_seconds = {per} }}
over_limit = "drop"
notice = true
"""


def flood_plan(bot: str, rate: float, duration: float, *, users: int = 3) -> Plan:
    """One group chat, `rate` triggering messages a second for `duration` seconds."""
    run_id = uuid.uuid4().hex[:6]
    chat = f"flood-{run_id}"
    total = max(1, int(rate * duration))
    messages: list[Sent] = []
    offsets: list[float] = []
    for i in range(total):
        msg_id = f"{run_id}-f{i}"
        user = f"f{i % users}"
        body = {
            "chat_id": chat,
            "chat_type": "group",
            "user_id": user,
            "user_name": user.upper(),
            "text": f"msg:{msg_id} flooding",
            "message_id": msg_id,
            "mentions": ["bot"],
        }
        messages.append(Sent(msg_id, chat, "group", True, 0.0, json.dumps(body).encode()))
        offsets.append(i / rate)
    return Plan(messages, offsets, [(chat, "group")], bot, run_id)


def _overhead(phase: PhaseResult) -> dict[str, Any]:
    return dict(phase.data["latency_ms"]["pipeline_overhead"])


def _ratio(flooded: float | None, alone: float | None) -> float | None:
    return round(flooded / alone, 2) if flooded is not None and alone else None


async def flood_outcome(bs: BenchStack, plan: Plan, generator: Generator) -> dict[str, Any]:
    """What became of the flooding chat's messages, from what was delivered to it."""
    chat = plan.chats[0][0]
    deliveries = await bs.deliveries(plan.bot, [chat])
    replies = [d for d in deliveries if d.kind == "reply"]
    notices = [d for d in deliveries if d.kind == "notice"]
    flooded = {s.msg_id for s in plan.messages}
    answered = {token for d in replies for token in d.tokens if token in flooded}
    return {
        "chat": chat,
        "sent": generator.stats.sent,
        "accepted": generator.stats.acked,
        "turns": len(replies),
        "answered": len(answered),
        # Answered in a turn another of its messages started (the busy policy's merge).
        "merged": max(0, len(answered) - len(replies)),
        # Never answered by the end of the drain: still held, rate-limited or dropped.
        "not_answered": generator.stats.acked - len(answered),
        "notices": len(notices),
        "notice_texts": sorted({d.text for d in notices})[:5],
    }


async def _pending_peaks(bs: BenchStack, peaks: dict[str, float]) -> None:
    """The most work each stage's executor held accepted and unacknowledged (summed over workers),
    sampled every second: where a flood piles up (at `max_pending` a stage stops fetching)."""
    async with httpx.AsyncClient(timeout=5, verify=TLS) as http:
        while True:
            now: dict[str, float] = {}
            for url in bs.urls():
                with contextlib.suppress(httpx.HTTPError):
                    for key, value in (await scrape_metrics(url, http)).items():
                        if key.startswith("switchboard_executor_pending{"):
                            stage = key.partition('stage="')[2].partition('"')[0]
                            now[stage] = now.get(stage, 0.0) + value
            for stage, value in now.items():
                peaks[stage] = max(peaks.get(stage, 0.0), value)
            await asyncio.sleep(1.0)


async def flood_run(bs: BenchStack, mix: TrafficMix, args: argparse.Namespace) -> dict[str, Any]:
    """The two phases and the figure (the stack is warmed up by the caller)."""
    log(f"flood: baseline, {args.rate:g} msg/s of normal traffic for {args.duration:g} s")
    alone = await run_phase(bs, mix, args.rate, args.duration, label="alone", drain_timeout=60)
    plan = flood_plan(mix.bot, args.flood_rate, args.duration)
    log(f"flood: the same traffic beside one chat sending {args.flood_rate:g} triggering msg/s")
    flooder = Generator(plan, bs.urls)
    peaks: dict[str, float] = {}
    sampler = asyncio.create_task(_pending_peaks(bs, peaks))
    flooder.start()
    try:
        flooded = await run_phase(bs, mix, args.rate, args.duration, label="flooded", drain_timeout=60)
    finally:
        flooder.stop()
        await flooder.wait()
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    # The flooding chat's backlog may outlast the phase's drain (which follows the normal traffic):
    # its outcome is read once the workers have nothing left in flight.
    drained = True
    try:
        await wait_idle(bs.urls, quiet=1.0, timeout=180)
    except TimeoutError:
        drained = False
    base, with_flood = _overhead(alone), _overhead(flooded)
    result: dict[str, Any] = {
        "normal_rate_msgs_per_s": args.rate,
        "flood_rate_msgs_per_s": args.flood_rate,
        "flood_limit": args.flood_limit,
        "duration_s": args.duration,
        "others_overhead_ms": {"alone": base, "flooded": with_flood},
        "others_turns": {"alone": alone.data["turns"], "flooded": flooded.data["turns"]},
        "ratio_p50": _ratio(with_flood.get("p50"), base.get("p50")),
        "ratio_p99": _ratio(with_flood.get("p99"), base.get("p99")),
        "target_ratio": TARGET_RATIO,
        "flooding_chat": {**await flood_outcome(bs, plan, flooder), "drained": drained},
        "executor_pending_peak": peaks,
        "phases": {"alone": alone.data, "flooded": flooded.data},
    }
    result["met"] = all(r is not None and r <= TARGET_RATIO for r in (result["ratio_p50"], result["ratio_p99"]))
    outcome = result["flooding_chat"]
    log(
        f"flood: others' overhead p50 {base.get('p50')} → {with_flood.get('p50')} ms (ratio {result['ratio_p50']}), "
        f"p99 {base.get('p99')} → {with_flood.get('p99')} ms (ratio {result['ratio_p99']}); target ≤ {TARGET_RATIO}: "
        f"{'met' if result['met'] else 'MISSED'}"
    )
    log(
        f"flood: the flooding chat sent {outcome['sent']} ({outcome['accepted']} accepted): {outcome['turns']} turns, "
        f"{outcome['merged']} merged into them, {outcome['not_answered']} not answered, {outcome['notices']} notices"
    )
    log(f"flood: executor pending peaks by stage (max_pending stops a stage's fetch): {peaks}")
    return result
