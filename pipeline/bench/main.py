"""The `switchboard bench` run: phases in order, one JSON + one PNG at the end."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaProducer

from pipeline.bench import default_name
from pipeline.bench.bare_turn import BareTurnTarget, bare_turn_for, bare_turn_target
from pipeline.bench.limit import bare_chain, bare_one_hop
from pipeline.bench.load import TrafficMix
from pipeline.bench.measure import proc_cpu_seconds, profile_worker
from pipeline.bench.report import RESULTS, machine, markdown_summary, write_chart, write_json
from pipeline.bench.runner import (
    BenchStack,
    PhaseResult,
    attach_stack,
    log,
    phase_series,
    ramp,
    ramps,
    run_phase,
    start_stack,
    warm_up,
    worker_counters,
)
from pipeline.records import InboundMessage, Sender, conversation_key, now_ms
from pipeline.topics import IM_INBOUND


def mix_from(args: argparse.Namespace, **over: Any) -> TrafficMix:
    base = {
        "conversations": args.conversations,
        "private_share": args.private_share,
        "filtered_share": args.filtered_share,
        "burst_prob": args.burst_prob,
        "burst_size": args.burst_size,
        "bot": args.bot,
        "think": args.think,
        "chat_prefix": f"c{uuid.uuid4().hex[:6]}",
    }
    base.update(over)
    return TrafficMix(**base)


def phase_dict(phase: PhaseResult) -> dict[str, Any]:
    return {**phase.data, "timeline": phase.timeline}


async def limit_for(bs: BenchStack, load: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    fetch_wait = int(bs.settings_env.get("SWITCHBOARD_KAFKA_FETCH_MAX_WAIT_MS", "20"))
    turns_per_s = load["throughput"]["turns_per_s"] or 0.0
    log("limit: bare aiokafka chain on the same broker")
    chain = await bare_chain(
        bs.bootstrap,
        topics=4,
        partitions=args.partitions,
        messages=args.limit_messages,
        fetch_wait_ms=fetch_wait,
        latency_rate=max(1.0, turns_per_s / 2) if turns_per_s else None,
        broker_pid=bs.broker.pid if bs.broker else None,
    )
    one_hop = await bare_one_hop(
        bs.bootstrap,
        partitions=args.partitions,
        messages=args.limit_messages,
        fetch_wait_ms=fetch_wait,
        broker_pid=bs.broker.pid if bs.broker else None,
    )
    rpt = load["kafka"]["records_per_turn"]
    limit_turns = chain["records_per_s"] / rpt if rpt else None
    out = {
        "bare_chain": chain,
        "bare_one_hop": one_hop,
        "records_per_turn": rpt,
        "limit_turns_per_s": round(limit_turns, 1) if limit_turns else None,
        "pipeline_turns_per_s": turns_per_s,
        "ratio_turns_to_limit": round(turns_per_s / limit_turns, 4) if limit_turns else None,
        "note": "limit = bare 4-topic chain records/s ÷ the pipeline's Kafka records per turn (same run, broker, "
        "partitions); the bare chain's latency was taken at half the pipeline's turns/s",
    }
    overhead_p99 = load["latency_ms"]["pipeline_overhead"]["p99"]
    bare_p99 = (chain.get("latency_ms") or {}).get("p99")
    own_p99 = (load["latency_ms"].get("pipeline_overhead_excluding_busy_wait") or {}).get("p99")
    if overhead_p99 is not None and bare_p99:
        out["overhead_p99_over_bare_p99"] = round(overhead_p99 / bare_p99, 2)
    if own_p99 is not None and bare_p99:
        out["overhead_excluding_busy_wait_p99_over_bare_p99"] = round(own_p99 / bare_p99, 2)
    log(
        f"limit: bare chain {chain['records_per_s']:.0f} records/s → {out['limit_turns_per_s']} turns/s at "
        f"{rpt} records/turn; pipeline {turns_per_s} turns/s = {out['ratio_turns_to_limit']} of the limit"
    )
    return out


async def filtered_phase(bs: BenchStack, args: argparse.Namespace, one_hop: dict[str, Any] | None) -> dict[str, Any]:
    """Only group messages without @bot: how fast ingress and ingest take and drop them, offered at
    the target (5,000/s per worker) so that the worker, not the offer, bounds the figure."""
    mix = mix_from(args, private_share=0.0, filtered_share=1.0, burst_prob=0.0)
    rate = 5000.0 if not args.quick else 50.0
    phase = await run_phase(bs, mix, rate, min(args.duration, 10.0), label="filtered", drain_timeout=60)
    d = phase_dict(phase)
    ingest_rate = d["messages"]["ingested"] / max(phase.data.get("ingest_seconds") or d["wall_s"], 1e-6)
    d["ingest_msgs_per_s"] = round(ingest_rate, 1)
    if one_hop and one_hop.get("msgs_per_s"):
        d["ratio_to_bare_one_hop"] = round(ingest_rate / one_hop["msgs_per_s"], 4)
    log(
        f"filtered: ingest {ingest_rate:.0f} msg/s (offered {rate:.0f}/s, accepted "
        f"{d['throughput']['inbound_msgs_per_s']}/s); ratio to bare one hop {d.get('ratio_to_bare_one_hop')}"
    )
    return d


async def filtered_drain_phase(
    bs: BenchStack, args: argparse.Namespace, one_hop: dict[str, Any] | None
) -> dict[str, Any]:
    """Ingest's own rate for group messages without @bot: N of them are produced straight into
    `im.inbound` (as the ingress of other workers would) faster than one worker takes them, and the
    worker's drain is timed from its metrics. This is the figure comparable to a bare one-hop
    consume; `filtered_phase` measures ingress and ingest together in one process."""
    n = 5_000 if args.quick else args.filtered_messages
    producer = AIOKafkaProducer(bootstrap_servers=bs.bootstrap, linger_ms=5, acks=-1)
    run = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(timeout=5.0) as http:
        base = (await worker_counters(bs, http))["ingested"]
        pids = bs.worker_pids()
        await producer.start()
        try:
            # Serialised before the clock starts, as the bare one-hop's payloads are: building 50,000
            # pydantic records in this process would take the cores the worker is timed on.
            records = [
                (m.model_dump_json().encode(), m.conversation_key.encode())
                for m in (_filtered_message(run, i, args.conversations) for i in range(n))
            ]
            started = time.monotonic()
            cpu0 = sum(proc_cpu_seconds(p) for p in pids)
            deliveries = []
            for value, key in records:
                deliveries.append(await producer.send(IM_INBOUND, value, key=key))
            await asyncio.gather(*deliveries)
            produced_s = time.monotonic() - started
        finally:
            await producer.stop()
        # The rate from here on is the worker's alone on a backlog: the producer no longer takes CPU.
        produced_at = time.monotonic()
        ingested_when_produced = (await worker_counters(bs, http))["ingested"] - base
        first_at: float | None = None
        done_at: float | None = None
        count = base
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            count = (await worker_counters(bs, http))["ingested"]
            now = time.monotonic()
            if first_at is None and count > base:
                first_at = now
            if count >= base + n:
                done_at = now
                break
            await asyncio.sleep(0.1)
        cpu = sum(proc_cpu_seconds(p) for p in pids) - cpu0
    took = (done_at or time.monotonic()) - started
    tail_s = (done_at or time.monotonic()) - produced_at
    tail = count - base - ingested_when_produced
    d: dict[str, Any] = {
        "messages": n,
        "ingested": int(count - base),
        "produced_in_s": round(produced_s, 2),
        "drain_s": round(took, 2),
        "ingest_msgs_per_s": round((count - base) / took, 1) if took > 0 else None,
        "worker_cpu_us_per_msg": round(cpu / max(count - base, 1) * 1e6, 1),
        "complete": done_at is not None,
        # After the producer finished: how many were left, and how fast the worker took them.
        "left_when_produced": int(n - ingested_when_produced),
        "after_produced_msgs_per_s": round(tail / tail_s, 1) if tail > 0 and tail_s > 0 else None,
    }
    if one_hop and one_hop.get("msgs_per_s") and d["ingest_msgs_per_s"]:
        d["ratio_to_bare_one_hop"] = round(d["ingest_msgs_per_s"] / one_hop["msgs_per_s"], 4)
    log(
        f"filtered backlog: {d['ingested']}/{n} ingested in {d['drain_s']} s = {d['ingest_msgs_per_s']} msg/s, "
        f"{d['worker_cpu_us_per_msg']} µs worker CPU each; ratio to bare one hop {d.get('ratio_to_bare_one_hop')}; "
        f"after the producer was done: {d['left_when_produced']} left, taken at {d['after_produced_msgs_per_s']} msg/s"
    )
    return d


def _filtered_message(run: str, i: int, chats: int) -> InboundMessage:
    chat = f"drain-{run}-g{i % max(chats, 1)}"
    return InboundMessage(
        platform="console",
        bot_id="demo",
        chat_id=chat,
        chat_type="group",
        sender=Sender(user_id=f"u{i % 37}", name="member"),
        message_id=f"{run}-{i}",
        text="just chatting about the weather, no mention here",
        conversation_key=conversation_key("console", "demo", chat),
        trace_id=f"{run}{i:08d}",
        hops={"ingress": now_ms()},
    )


def headline(result: dict[str, Any]) -> dict[str, Any]:
    load = result.get("load") or {}
    lim = result.get("limit") or {}
    h: dict[str, Any] = {}
    if load:
        h.update(
            {
                "turns_per_s_per_worker": load["throughput"]["turns_per_s_per_worker"],
                "inbound_msgs_per_s_per_worker": load["throughput"]["inbound_msgs_per_s_per_worker"],
                "e2e_p50_ms": load["latency_ms"]["end_to_end"]["p50"],
                "e2e_p99_ms": load["latency_ms"]["end_to_end"]["p99"],
                "overhead_p50_ms": load["latency_ms"]["pipeline_overhead"]["p50"],
                "overhead_p99_ms": load["latency_ms"]["pipeline_overhead"]["p99"],
                "overhead_excluding_busy_wait_p99_ms": (
                    load["latency_ms"].get("pipeline_overhead_excluding_busy_wait") or {}
                ).get("p99"),
                "worker_cpu_ms_per_turn": load["cpu"]["worker_ms_per_turn"],
                "redis_ops_per_turn": load["redis"]["ops_per_turn"],
                "redis_round_trips_per_turn": load["redis"].get("round_trips_per_turn", "n/a"),
                "kafka_records_per_turn": load["kafka"]["records_per_turn"],
                "kafka_records_per_turn_by_topic": load["kafka"].get("records_per_turn_by_topic"),
                "generator_cpu_pct": load["cpu"]["generator_pct_of_core"],
                "worker_loop_stalls": load["cpu"].get("worker_loop_stalls"),
            }
        )
    if lim:
        h["limit_turns_per_s"] = lim.get("limit_turns_per_s")
        h["ratio_to_limit"] = lim.get("ratio_turns_to_limit")
    if result.get("max"):
        h["max_turns_per_s"] = result["max"].get("max_turns_per_s")
    bare = result.get("bare_turn") or {}
    if bare:
        same = bare.get("same_rate") or {}
        e2e = (same.get("latency_ms") or {}).get("end_to_end") or {}
        h.update(
            {
                "bare_turn_turns_per_s": bare.get("bare_turn_turns_per_s"),
                "bare_turn_max_turns_per_s": bare.get("bare_turn_max_turns_per_s"),
                "bare_turn_cpu_ms_per_turn": bare.get("bare_turn_cpu_ms_per_turn"),
                "bare_turn_e2e_p50_ms": e2e.get("p50"),
                "bare_turn_e2e_p99_ms": e2e.get("p99"),
                "bare_turn_kafka_records_per_turn": (same.get("kafka") or {}).get("records_per_turn"),
                "ratio_turns_to_bare_turn": bare.get("ratio_turns_to_bare_turn_max"),
                "ratio_cpu_per_turn_bare_to_pipeline": bare.get("ratio_cpu_per_turn"),
                "ratio_hop_p50_max_to_bare_turn": bare.get("ratio_hop_p50_max"),
                "ratio_overhead_excluding_busy_wait_p99_to_bare_turn": bare.get(
                    "ratio_overhead_excluding_busy_wait_p99"
                ),
                "hop_parts_largest_excess_p50": _named_excess(bare, "p50"),
                "hop_parts_largest_excess_p99": _named_excess(bare, "p99"),
            }
        )
    flood = result.get("flood") or {}
    if flood:
        h["flood_others_overhead_p50_ratio"] = flood.get("ratio_p50")
        h["flood_others_overhead_p99_ratio"] = flood.get("ratio_p99")
        h["flood_chat_outcome"] = {
            k: flood["flooding_chat"][k] for k in ("sent", "turns", "merged", "not_answered", "notices")
        }
    if result.get("filtered"):
        h["filtered_webhooks_msgs_per_s"] = result["filtered"].get("ingest_msgs_per_s")
    if result.get("filtered_backlog"):
        h["filtered_backlog_msgs_per_s"] = result["filtered_backlog"].get("ingest_msgs_per_s")
        h["filtered_ratio_to_bare_one_hop"] = result["filtered_backlog"].get("ratio_to_bare_one_hop")
    scale = result.get("scale") or {}
    if scale.get("scaling_factor") is not None:
        h["scaling_1_to_2_workers"] = scale["scaling_factor"]
    if result.get("streams"):
        h["streams_held"] = result["streams"].get("streams_held")
        h["streams_worker_rss_mib"] = result["streams"].get("worker_rss_mib")
    if result.get("chaos"):
        acc = result["chaos"]["accounting"]
        h["chaos_lost"] = acc["lost"]
        h["chaos_duplicated"] = acc["duplicated"]
        h["chaos_posted_twice"] = acc["posted_twice"]
        onebot = result["chaos"].get("onebot_ws")
        if onebot is not None:
            h["chaos_onebot_ws_lost"] = onebot["lost"]
            h["chaos_onebot_ws_lost_in_dead_socket"] = onebot["lost_in_dead_socket"]
            h["chaos_onebot_ws_duplicated"] = onebot["duplicated"]
        h["chaos_late"] = acc["late"]
        h["chaos_answer_latency_ms"] = acc.get("answer_latency_ms")
        cluster = result["chaos"].get("kafka_cluster")
        if cluster is not None:
            h["chaos_kafka_normal_lag"] = cluster["normal_lag_bound"]
            for w in cluster["faults"]:
                h[f"chaos_kafka_{w['fault']}_lag_normal_again_s"] = w["lag_normal_again_s"]
                h[f"chaos_kafka_{w['fault']}_lag_recovered_s"] = w["lag_recovered_s"]
                h[f"chaos_kafka_{w['fault']}_max_lag"] = w["max_lag"]
                if w["fault"] == "leader":
                    h["chaos_kafka_leader_leaders_moved_s"] = w["leaders_moved_s"]
            if cluster["error"]:
                h["chaos_kafka_error"] = cluster["error"]
    return h


def _named_excess(bare: dict[str, Any], stat: str) -> str | None:
    """The hop parts where the pipeline's `stat` exceeds the bare turn's most (pipeline/bench/hops.py)."""
    found = (bare.get("hop_breakdown") or {}).get(f"largest_excess_{stat}") or []
    return ", ".join(f"{f['part']} +{f[f'excess_{stat}_ms']} ms" for f in found) or None


def warm_load_seconds(args: argparse.Namespace, broker_kind: str) -> float:
    """`--warm-load`, or its default: 30 s on Apache Kafka (a fresh JVM spends its first minute
    compiling, on the cores the phases share: measured, the first phase paid it), none on Tansu."""
    chosen: float | None = getattr(args, "warm_load", None)
    if chosen is not None:
        return max(0.0, chosen)
    return 30.0 if broker_kind == "kafka" else 0.0


async def run_on(bs: BenchStack, args: argparse.Namespace, result: dict[str, Any], name: str, out_dir: Path) -> None:
    mix = mix_from(args)
    log(f"warm-up: {mix.conversations} conversations")
    await warm_up(bs, mix)
    warm_load = warm_load_seconds(args, bs.broker_kind) if args.mode != "max" else 0.0
    result["warm_load_s"] = warm_load
    if warm_load > 0:
        log(f"warm-up: {warm_load:g} s of load at {args.rate:g} msg/s, not measured (--warm-load)")
        await run_phase(bs, mix, args.rate, warm_load, label="warm-load", seed=2)
    if args.flood:  # the fairness scenario alone (pipeline/bench/flood.py)
        from pipeline.bench.flood import flood_run

        result["flood"] = await flood_run(bs, mix, args)
        return
    bare_wanted = not args.no_bare_turn and bs.broker_kind != "attached"
    async with contextlib.AsyncExitStack() as running:
        bare: BareTurnTarget | None = None
        bare_max: dict[str, Any] | None = None
        if args.mode == "max":
            if bare_wanted:  # both ramps interleaved, step by step (`ramps`); the bare worker idles meanwhile
                bare = await running.enter_async_context(bare_turn_target(bs, mix_from(args), args))
                result["max"], bare_max = await ramps([("ramp", bs), ("bare turn ramp", bare)], mix, args)
            else:
                result["max"] = await ramp(bs, mix, args)
            best = result["max"].get("max_offered_msgs_per_s") or args.ramp_start
            log(f"max mode: best offered rate {best} msg/s; measuring the load phase at that rate")
            args.rate = best
        profile_task = None
        pids = bs.worker_pids()
        if args.profile and pids:
            profile_task = asyncio.create_task(
                profile_worker(pids[0], min(args.profile, max(2.0, args.duration - 2)), out_dir / f"{name}-pyspy.txt")
            )
        phase = await run_phase(bs, mix, args.rate, args.duration, label="load")
        result["load"] = phase_dict(phase)
        result["_series"] = phase_series(phase)
        if profile_task is not None:
            result["profile"] = await profile_task
        if not args.no_limit and bs.broker_kind != "attached":
            result["limit"] = await limit_for(bs, result["load"], args)
        if bare_wanted:
            if bare is None:
                bare = await running.enter_async_context(bare_turn_target(bs, mix_from(args), args))
            result["bare_turn"] = await bare_turn_for(
                bare, mix_from(args), args, result, ramped=bare_max, out_dir=out_dir, name=name
            )
    if args.filtered:
        one_hop = (result.get("limit") or {}).get("bare_one_hop")
        result["filtered"] = await filtered_phase(bs, args, one_hop)
        result["filtered_backlog"] = await filtered_drain_phase(bs, args, one_hop)


def _flood_limited_bot(args: argparse.Namespace) -> str:
    """`--flood --flood-limit`: the bot both phases use (bots file text), else nothing."""
    if not (args.flood and args.flood_limit):
        return ""
    from pipeline.bench.flood import LIMITED_BOT, limited_bot_toml

    args.bot = LIMITED_BOT
    return limited_bot_toml(args.flood_limit)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = args.out or RESULTS
    name = default_name(args)
    result: dict[str, Any] = {
        "name": name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("out",)},
    }
    if args.scale_workers:
        return await _capacity(args, result, out_dir, name)
    if args.soak:
        from pipeline.bench.soak import soak_run

        return await soak_run(args, result, out_dir, name)
    brokers = ["tansu", "kafka"] if args.broker == "both" else [args.broker]
    ok = True
    if args.attach:
        bs = await attach_stack(args.attach, args.worker_pid)
        try:
            await run_on(bs, args, result, name, out_dir)
        finally:
            await bs.close()
        brokers = []
    extra_only = (
        (args.chaos or args.streams)
        and args.mode == "fixed"
        and not (args.scale or args.memory or args.filtered or args.broker == "both" or args.with_load)
    )
    if extra_only:
        brokers = []  # `--chaos` / `--streams N` alone: only that (add --with-load for the load phases too)
    comparison: dict[str, Any] = {}
    for index, broker in enumerate(brokers):
        run_dir = (args.run_dir / broker) if args.run_dir else None
        log(f"starting the stack on {broker} ({args.workers} worker(s), think {args.think}s)")
        bs = await start_stack(
            broker=broker,
            workers=args.workers,
            think=args.think,
            run_dir=run_dir,
            partitions=args.partitions,
            log_level=args.log_level,
            aof=args.chaos,
            # The hops' parts (pipeline/hopstamps.py), as the bare turn stamps them; --env may turn them off.
            extra_env={"SWITCHBOARD_HOP_STAMPS": "true", **dict(kv.split("=", 1) for kv in args.env)},
            extra_bots=_flood_limited_bot(args),
        )
        log(f"stack up: run dir {bs.run_dir}")
        target = result if index == 0 else {}
        try:
            await run_on(bs, args, target, name, out_dir)
            if index == 0:
                if args.scale:
                    from pipeline.bench.scale import scale_phase

                    result["scale"] = await scale_phase(bs, args, mix_from(args))
                if args.memory:
                    from pipeline.bench.scale import idle_memory

                    result["memory_idle"] = await idle_memory(bs, args)
        finally:
            await bs.close()
        load = target.get("load") or {}
        comparison[broker] = {
            "turns_per_s": load.get("throughput", {}).get("turns_per_s"),
            "inbound_msgs_per_s": load.get("throughput", {}).get("inbound_msgs_per_s"),
            "e2e_ms": load.get("latency_ms", {}).get("end_to_end"),
            "overhead_ms": load.get("latency_ms", {}).get("pipeline_overhead"),
            "stages_p50_ms": {k: v.get("p50") for k, v in load.get("latency_ms", {}).get("stages", {}).items()},
            "worker_cpu_ms_per_turn": load.get("cpu", {}).get("worker_ms_per_turn"),
            "broker_cpu_s": load.get("cpu", {}).get("seconds", {}).get("broker"),
            "limit": {k: (target.get("limit") or {}).get(k) for k in ("limit_turns_per_s", "ratio_turns_to_limit")},
            "bare_chain_latency_ms": ((target.get("limit") or {}).get("bare_chain") or {}).get("latency_ms"),
            "bare_chain_records_per_s": ((target.get("limit") or {}).get("bare_chain") or {}).get("records_per_s"),
            "hop_breakdown": (target.get("bare_turn") or {}).get("hop_breakdown"),
            "bare_turn": {
                k: (target.get("bare_turn") or {}).get(k)
                for k in (
                    "bare_turn_turns_per_s",
                    "bare_turn_max_turns_per_s",
                    "bare_turn_cpu_ms_per_turn",
                    "ratio_turns_to_bare_turn_max",
                    "ratio_cpu_per_turn",
                )
            },
        }
    if len(comparison) > 1:
        result["broker_comparison"] = comparison
    if args.streams:
        from pipeline.bench.scale import streams_phase

        result["streams"] = await streams_phase(args)
    if args.chaos:
        from pipeline.bench.chaos import ChaosConfig, run_chaos

        cfg = ChaosConfig(
            duration=args.chaos_duration,
            kill_every=args.kill_every,
            rate=args.chaos_rate,
            broker="kafka" if args.broker == "kafka" or args.kafka_cluster else "tansu",
            redis=args.redis,
            run_dir=(args.run_dir / "chaos") if args.run_dir else None,
            kafka_nodes=args.kafka_cluster,
        )
        if args.chaos_kill:  # the broker's faults alone, so what they cost is theirs
            cfg.broker_faults = tuple(args.chaos_kill)
            cfg.broker_down_for = args.broker_down_for
            cfg.kill_every, cfg.redis_restarts, cfg.drop_streams = 0, 0, 0
            cfg.api_faults = cfg.accept_delay = cfg.kill_in_accept_delay = False
        result["chaos"] = await run_chaos(cfg)
        acc = result["chaos"]["accounting"]
        ok = acc["lost"] == 0 and acc["duplicated"] == 0 and acc["posted_twice"] == 0
        onebot = result["chaos"].get("onebot_ws")
        ok = ok and (onebot is None or (onebot["lost"] == 0 and onebot["duplicated"] == 0))
        cluster = result["chaos"].get("kafka_cluster")
        ok = ok and (cluster is None or not cluster["error"])
    series = result.pop("_series", [])
    result["headline"] = headline(result)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result["machine"]["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["ok"] = ok
    json_path = write_json(result, out_dir, name)
    png_path = None
    with contextlib.suppress(Exception):
        png_path = write_chart(result, series, out_dir, name)
    with contextlib.suppress(Exception):
        await asyncio.to_thread((out_dir / f"{name}.md").write_text, markdown_summary(result))
    log(f"result: {json_path}" + (f", chart: {png_path}" if png_path else ""))
    for k, v in result["headline"].items():
        print(f"  {k:32s} {v}")
    result["_paths"] = (str(json_path), str(png_path) if png_path else None)
    return result


async def _capacity(args: argparse.Namespace, result: dict[str, Any], out_dir: Path, name: str) -> dict[str, Any]:
    """`--scale-workers`: the capacity run alone (pipeline/bench/capacity.py)."""
    from pipeline.bench.capacity import capacity_run, write_markdown

    result["capacity"] = await capacity_run(args)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result["machine"]["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    json_path = write_json(result, out_dir, name)
    md_path = await asyncio.to_thread(write_markdown, result, out_dir, name)
    log(f"result: {json_path}, {md_path}")
    return result
