"""Scale: 1 vs 2 worker processes on the same partitions, rebalance under load, memory per
conversation, and how many turns in flight (open SSE streams) one worker holds."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import httpx

from pipeline.bench.load import Generator, Sent, TrafficMix, build_plan
from pipeline.bench.measure import metric_sum, rss_mib, scrape_metrics
from pipeline.bench.runner import BenchStack, DeliveryCounter, log, ramp, start_stack, warm_up, worker_counters
from pipeline.embedded.exceptions import ServiceStartError
from pipeline.kafka import LagReader
from pipeline.topics import IM_INBOUND, SESSION_EVENTS, SESSION_INPUT, outbound_topic

PIPELINE_TOPICS = [IM_INBOUND, SESSION_INPUT, SESSION_EVENTS, outbound_topic("console")]


async def _lag(reader: LagReader, group: str) -> int:
    try:
        return (await reader.read(group, PIPELINE_TOPICS)).total
    except Exception:
        return -1


async def rebalance_phase(bs: BenchStack, mix: TrafficMix, rate: float, *, settle: float = 12.0) -> dict[str, Any]:
    """Under a steady load: a second worker joins, then the first is SIGKILLed.

    join: seconds from spawning the new worker to (a) its first delivered reply (it owns partitions
    and handles turns end to end) and (b) the group's lag back to its pre-join level.
    leave: seconds from the SIGKILL to the lag back to its pre-kill level (the survivor took the
    partitions over: session timeout + rebalance + catch-up).
    """
    assert bs.stack is not None
    duration = settle * 3 + 60
    plan = build_plan(mix, rate, duration, seed=77)
    gen = Generator(plan, bs.urls)
    reader = LagReader(bs.bootstrap)
    await reader.start()
    http = httpx.AsyncClient(timeout=5)
    samples: list[tuple[float, int]] = []
    out: dict[str, Any] = {"offered_msgs_per_s": rate}
    t0 = time.monotonic()
    gen.start()
    try:

        async def sample_until(t_end: float) -> None:
            while time.monotonic() < t_end:
                samples.append((time.monotonic() - t0, await _lag(reader, bs.app_id)))
                await asyncio.sleep(0.25)

        await sample_until(t0 + settle)
        base = sorted(v for _, v in samples if v >= 0)
        baseline = base[int(len(base) * 0.9)] if base else 0
        threshold = max(20, baseline * 2)
        out["lag_baseline_p90"] = baseline
        # -- join -------------------------------------------------------------------------------------
        t_join = time.monotonic()
        log("rebalance: adding a worker under load")
        try:
            new = await bs.stack.add_worker()
        except ServiceStartError as exc:
            # A finding, not a crash of the run: e.g. the group's rebalance waited for the running
            # worker to finish every record it had fetched, and the newcomer's start waited for it.
            out["join_error"] = str(exc).splitlines()[0]
            out["join_error_after_s"] = round(time.monotonic() - t_join, 2)
            log(f"rebalance: the new worker did not get ready: {out['join_error']}")
            return out
        out["join_process_ready_s"] = round(time.monotonic() - t_join, 2)
        first_reply = None
        lag_rose = False
        recovered = None
        while time.monotonic() - t_join < 60:
            m = await scrape_metrics(new.url, http)
            lag = await _lag(reader, bs.app_id)
            now = time.monotonic()
            samples.append((now - t0, lag))
            if lag > threshold:
                lag_rose = True
            if first_reply is None and metric_sum(m, "switchboard_egress_total", outcome="sent") > 0:
                first_reply = now - t_join
            if recovered is None and lag >= 0 and lag <= threshold and (lag_rose or now - t_join > 8) and first_reply:
                recovered = now - t_join
            if first_reply is not None and recovered is not None:
                break
            await asyncio.sleep(0.25)
        out["join_first_reply_by_new_worker_s"] = round(first_reply, 2) if first_reply else None
        out["join_lag_recovered_s"] = round(recovered, 2) if recovered else None
        await sample_until(time.monotonic() + settle)
        # -- leave (SIGKILL) --------------------------------------------------------------------------
        victim = bs.stack.workers[0]
        survivor = new
        before = metric_sum(await scrape_metrics(survivor.url, http), "switchboard_egress_total", outcome="sent")
        t_kill = time.monotonic()
        log(f"rebalance: SIGKILL worker pid {victim.pid} under load")
        await victim.kill()
        lag_rose = False
        recovered = None
        peak = 0
        while time.monotonic() - t_kill < 90:
            lag = await _lag(reader, bs.app_id)
            now = time.monotonic()
            samples.append((now - t0, lag))
            peak = max(peak, lag)
            if lag > threshold:
                lag_rose = True
            if lag_rose and 0 <= lag <= threshold:
                recovered = now - t_kill
                break
            await asyncio.sleep(0.25)
        after = metric_sum(await scrape_metrics(survivor.url, http), "switchboard_egress_total", outcome="sent")
        out["leave_lag_peak"] = peak
        out["leave_lag_recovered_s"] = round(recovered, 2) if recovered else None
        out["leave_survivor_replies_during"] = after - before
        out["lag_threshold"] = threshold
        log(f"rebalance: {out}")
        # bring the stack back to its worker count for what follows
        t_restore = time.monotonic()
        try:
            await bs.stack.add_worker()
            out["rejoin_after_kill_ready_s"] = round(time.monotonic() - t_restore, 2)
        except ServiceStartError as exc:
            out["rejoin_after_kill_error"] = str(exc).splitlines()[0]
            log(f"rebalance: a worker started after the kill did not get ready: {out['rejoin_after_kill_error']}")
    finally:
        gen.stop()
        await gen.wait()
        await reader.stop()
        await http.aclose()
    out["lag_samples"] = [(round(t, 2), v) for t, v in samples[::2]]
    return out


async def scale_phase(bs: BenchStack, args: argparse.Namespace, mix: TrafficMix) -> dict[str, Any]:
    """The same ramp with 1 and with 2 workers (same partitions), then rebalance under load."""
    assert bs.stack is not None
    out: dict[str, Any] = {}
    while len([w for w in bs.stack.workers if w.is_running]) > 1:
        await [w for w in bs.stack.workers if w.is_running][-1].stop()
    await warm_up(bs, mix)
    out["max_1_worker"] = await ramp(bs, mix, args, label="scale 1 worker")
    await bs.stack.add_worker()
    await asyncio.sleep(3)
    out["max_2_workers"] = await ramp(bs, mix, args, label="scale 2 workers")
    one, two = out["max_1_worker"].get("max_turns_per_s"), out["max_2_workers"].get("max_turns_per_s")
    out["scaling_factor"] = round(two / one, 2) if one and two else None
    out["note"] = (
        "2 cores: broker, Redis, simulator, load generator and the workers share them, so a second "
        "worker process adds little when one worker already uses most of a core"
    )
    # rebalance: back to one worker, then join + SIGKILL under ~half of the one-worker max rate
    while len([w for w in bs.stack.workers if w.is_running]) > 1:
        await [w for w in bs.stack.workers if w.is_running][-1].stop()
    rate = (out["max_1_worker"].get("max_offered_msgs_per_s") or args.ramp_start) / 2
    out["rebalance"] = await rebalance_phase(bs, mix, rate)
    return out


async def idle_memory(bs: BenchStack, args: argparse.Namespace) -> dict[str, Any]:
    """Worker RSS before and after N new conversations that each had one turn and went idle."""
    n = args.idle_conversations
    pid = bs.worker_pids()[0]
    rss0 = rss_mib(pid)
    mix = TrafficMix(conversations=n, private_share=1.0, bot=args.bot, chat_prefix=f"idle{uuid.uuid4().hex[:4]}")
    await warm_up(bs, mix, wait_s=max(60.0, n / 20))
    await asyncio.sleep(3)
    rss1 = rss_mib(pid)
    out = {
        "conversations": n,
        "worker_rss_before_mib": round(rss0, 1),
        "worker_rss_after_mib": round(rss1, 1),
        "kib_per_idle_conversation": round((rss1 - rss0) * 1024 / n, 2),
        "note": "RSS rarely shrinks: growth here is heap kept by CPython after the turns, not per-conversation state",
    }
    log(f"memory: {out}")
    return out


async def streams_phase(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh one-worker stack; N private conversations each start a turn that thinks for a long
    time, so every turn stays in flight with its SSE stream open. Reports streams held and RSS."""
    target = args.streams
    think = 900.0
    bs = await start_stack(
        broker="tansu" if args.broker != "kafka" else "kafka",
        workers=1,
        think=0.0,
        run_dir=(args.run_dir / "streams") if args.run_dir else None,
        partitions=args.partitions,
        log_level=args.log_level,
    )
    out: dict[str, Any] = {"target": target}
    http = httpx.AsyncClient(timeout=10)
    try:
        pid = bs.worker_pids()[0]
        sim_pid = bs.stack.sim.pid if bs.stack and bs.stack.sim else None
        # idle baseline (a few turns done so every code path is loaded)
        mix = TrafficMix(conversations=50, private_share=1.0, bot="demo", chat_prefix="sbase")
        await warm_up(bs, mix)
        await asyncio.sleep(2)
        rss0 = rss_mib(pid)
        prefix = f"s{uuid.uuid4().hex[:4]}"
        plan = build_plan(TrafficMix(conversations=1, private_share=1.0, bot="demo"), 1.0, 1.0)
        plan.messages, plan.offsets, plan.chats = [], [], []
        rate = 250.0
        for i in range(target):
            chat = f"{prefix}-{i}"
            body = {
                "chat_id": chat,
                "chat_type": "private",
                "user_id": "u1",
                "user_name": "U1",
                "text": f"hold msg:{prefix}-{i} [sim:think={think:g}]",
                "message_id": f"{prefix}-{i}",
            }
            plan.messages.append(Sent(f"{prefix}-{i}", chat, "private", True, 0.0, json.dumps(body).encode()))
            plan.offsets.append(i / rate)
            plan.chats.append((chat, "private"))
        gen = Generator(plan, bs.urls, connections=128)
        t0 = time.monotonic()
        gen.start()
        held = 0.0
        best = 0.0
        stable_since = time.monotonic()
        timeline = []
        while True:
            await asyncio.sleep(2.0)
            m = await scrape_metrics(bs.urls()[0], http)
            held = metric_sum(m, "switchboard_sse_streams_open")
            sim_open = None
            if bs.sim_url:
                try:
                    sim_open = (await http.get(f"{bs.sim_url}/_sim/stats")).json().get("open_streams")
                except Exception:
                    sim_open = None
            rss = rss_mib(pid)
            timeline.append(
                {"t": round(time.monotonic() - t0, 1), "streams": held, "sim_open": sim_open, "rss_mib": round(rss, 1)}
            )
            log(
                f"[streams {time.monotonic() - t0:4.0f}s] sent {gen.stats.sent}/{target} accepted {gen.stats.acked} "
                f"streams open {held:.0f} (sim {sim_open}) worker RSS {rss:.0f} MiB"
            )
            if held > best:
                best, stable_since = held, time.monotonic()
            if held >= target or (gen.stats.done and time.monotonic() - stable_since > 20):
                break
            if time.monotonic() - t0 > max(300.0, target / 20):
                break
        await asyncio.sleep(3)
        rss1 = rss_mib(pid)
        m = await scrape_metrics(bs.urls()[0], http)
        held = metric_sum(m, "switchboard_sse_streams_open")
        out.update(
            {
                "streams_held": int(held),
                "seconds_to_open": round(time.monotonic() - t0, 1),
                "worker_rss_idle_mib": round(rss0, 1),
                "worker_rss_mib": round(rss1, 1),
                "kib_per_active_conversation": round((rss1 - rss0) * 1024 / max(held, 1), 1),
                "sim_rss_mib": round(rss_mib(sim_pid), 1) if sim_pid else None,
                "within_1_gib": rss1 <= 1024,
                "webhook_errors": gen.stats.errors,
                "timeline": timeline,
            }
        )
        counters = await worker_counters(bs, http)
        out["turns_triggered"] = counters["triggered"]
        log(
            f"streams: {out['streams_held']} held, worker RSS {out['worker_rss_mib']} MiB "
            f"({out['kib_per_active_conversation']} KiB per in-flight turn)"
        )
        gen.stop()
        await gen.wait()
    finally:
        await http.aclose()
        if bs.stack is not None:
            for w in bs.stack.workers:
                await w.kill()  # 10,000 open turns: no graceful stop needed
        await bs.close()
    return out


__all__ = ["DeliveryCounter", "idle_memory", "rebalance_phase", "scale_phase", "streams_phase"]
