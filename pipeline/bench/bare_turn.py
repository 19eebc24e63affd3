"""The bare turn: a turn's real work with nothing else, measured in the same run as the pipeline.

`pipeline.bench.bare_worker` does, per turn, the I/O a Switchboard worker does (webhook in over
HTTP, the same four Kafka topics, one session POST, one SSE read, 2 records of session events, one
platform POST) with aiohttp, aiokafka and json only. It runs against the same broker (its own fresh
topics, the same partitions and fetch wait) and the same session simulator as the pipeline, driven
by the same load generator and traffic profile. Its replies go to `PlatformStandIn` here, which
checks each request and records the delivery with its hop timestamps, so the latency split, the
steady-window turns/s and the CPU per turn are computed by the very code that measures the pipeline.

Reported: the bare turn at the pipeline's offered rate and at its max (the `--mode max` ramp), and
pipeline turns/s ÷ bare-turn turns/s and bare-turn CPU per turn ÷ pipeline CPU per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import secrets
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from pipeline.bench.hops import compare_breakdowns, format_breakdown
from pipeline.bench.load import Delivery, TrafficMix
from pipeline.bench.measure import profile_worker
from pipeline.bench.runner import BenchStack, log, ramp, run_phase, warm_up
from pipeline.embedded import free_port
from pipeline.kafka import TopicSpec, apply_topics
from pipeline.stack import HttpProcess

ROLES = ("inbound", "input", "events", "outbound")  # im.inbound, session.input, session.events, im.outbound.*


class BareWorkerProcess(HttpProcess):
    name = "bare-worker"
    start_timeout = 60.0

    def __init__(self, port: int, args: Sequence[str], env: dict[str, str], *, run_dir: Path | None = None) -> None:
        super().__init__(port, run_dir=run_dir, port_chosen_here=True)
        self.args = list(args)
        self.env = env

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "pipeline.bench.bare_worker", "--port", str(self.port), *self.args]

    def _env(self) -> dict[str, str]:
        return self.env


class _Watch:
    def __init__(self, platform: PlatformStandIn, bot: str) -> None:
        self.platform = platform
        self.bot = bot
        self.base = platform.count_by_bot[bot]

    @property
    def count(self) -> int:
        return self.platform.count_by_bot[self.bot] - self.base

    async def stop(self) -> None:
        return None


class PlatformStandIn:
    """The platform API the bare worker posts replies to (`POST /bots/{bot}/messages`). Checks what a
    platform checks (bearer token, a JSON body with id, kind, chat_id and a non-empty segments list),
    answers 200 and keeps each delivery with its receive time and hop timestamps."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(24)
        self.deliveries: list[Delivery] = []
        self.count_by_bot: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.duplicates = 0
        self._seen: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/bots/{bot}/messages", self._post)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _post(self, request: web.Request) -> web.Response:
        delivered_at = time.time() * 1000
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.rejected["unauthorized"] += 1
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401)
        try:
            body = await request.json()
            outbound_id, kind, chat_id = str(body["id"]), str(body["kind"]), str(body["chat_id"])
            segments = body["segments"]
            if not isinstance(segments, list) or not segments or not all(isinstance(s, dict) for s in segments):
                raise ValueError("segments must be a non-empty list of objects")
            hops = {str(k): float(v) for k, v in (body.get("hops") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.rejected["malformed"] += 1
            return web.json_response({"ok": False, "error": f"malformed: {exc}"}, status=400)
        if outbound_id in self._seen:
            self.duplicates += 1
            return web.json_response({"ok": True, "duplicate": True})
        self._seen.add(outbound_id)
        text = "".join(str((s.get("data") or {}).get("text", "")) for s in segments if s.get("type") == "text")
        reply_to = body.get("reply_to")
        self.deliveries.append(
            Delivery(chat_id, kind, str(reply_to) if reply_to else None, text, hops, delivered_at, outbound_id)
        )
        self.count_by_bot[request.match_info["bot"]] += 1
        return web.json_response({"ok": True})

    async def watch(self, bot: str) -> _Watch:
        return _Watch(self, bot)


@dataclass
class BareTurnTarget:
    """The bare worker as a load target (`pipeline.bench.runner.LoadTarget`). The pipeline's
    workers stay up, idle, during its phases: their CPU is reported as `pipeline_worker*`."""

    bootstrap: str
    worker: BareWorkerProcess
    platform: PlatformStandIn
    stack: BenchStack
    kafka_prefixes: tuple[str, ...]
    topics: list[str] = field(default_factory=list)
    redis: Any = None
    last_stats: dict[str, float] = field(default_factory=dict)

    def urls(self) -> list[str]:
        return [self.worker.url] if self.worker.is_running else []

    def pids(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {"worker0": self.worker.pid}
        for name, pid in self.stack.pids().items():
            out[f"pipeline_{name}" if name.startswith("worker") else name] = pid
        return out

    async def counters(self, http: httpx.AsyncClient) -> dict[str, float]:
        try:
            stats = (await http.get(self.worker.url + "/stats")).json()
        except (httpx.HTTPError, ValueError):
            stats = {}
        self.last_stats = {k: float(v) for k, v in stats.items()}
        return {
            "ingested": float(stats.get("ingested", 0)),
            "streams_open": float(stats.get("streams_open", 0)),
            "redis_round_trips": math.nan,
            "loop_lag_seconds": float(stats.get("loop_lag_us", 0)) / 1e6,
            "loop_lag_samples": float(stats.get("loop_lag_samples", 0)),
        }

    async def watch_deliveries(self, bot: str) -> _Watch:
        return await self.platform.watch(bot)

    async def deliveries(self, bot: str, chat_ids: Sequence[str]) -> list[Delivery]:
        wanted = set(chat_ids)
        return [d for d in self.platform.deliveries if d.chat_id in wanted]


@contextlib.asynccontextmanager
async def bare_turn_target(bs: BenchStack, mix: TrafficMix, args: argparse.Namespace) -> AsyncIterator[BareTurnTarget]:
    """The bare worker against the bench's stack (its own fresh topics on the same broker, the same
    simulator and settings), started and warmed up; stopped on the way out."""
    assert bs.stack is not None and bs.stack.sim is not None, "the bare turn needs the bench's own stack"
    settings = bs.stack.settings()
    api_key = settings.session_api_key.get_secret_value() if settings.session_api_key else ""
    run_id = uuid.uuid4().hex[:6]
    topics = [f"bare-{run_id}-{role}" for role in ROLES]
    await apply_topics(bs.bootstrap, [TopicSpec(t, args.partitions) for t in topics])
    platform = PlatformStandIn()
    await platform.start()
    worker = BareWorkerProcess(
        free_port(),
        [
            "--bootstrap",
            bs.bootstrap,
            "--topics",
            ",".join(topics),
            "--partitions",
            str(args.partitions),
            "--session-base",
            str(settings.session_base_url),
            "--sim-admin",
            bs.stack.sim.url,
            "--platform-url",
            platform.url,
            "--fetch-wait-ms",
            str(settings.kafka_fetch_max_wait_ms),
            "--batch-max",
            str(settings.batch_max),
            "--linger-ms",
            str(settings.kafka_linger_ms),
            "--busy-policy",
            "queue" if mix.bot == "queue" else "merge",
            "--merge-window-max",
            str(settings.merge_window_max),
        ],
        {"BARE_SESSION_API_KEY": api_key, "BARE_PLATFORM_TOKEN": platform.token},
        run_dir=(bs.run_dir / "bare-worker") if bs.run_dir else None,
    )
    target = BareTurnTarget(bs.bootstrap, worker, platform, bs, kafka_prefixes=(f"bare-{run_id}-",), topics=topics)
    try:
        await worker.start()
        log(f"bare turn: worker pid {worker.pid}, topics bare-{run_id}-*; warm-up")
        await warm_up(target, mix)
        yield target
    finally:
        await worker.stop()
        await platform.stop()


async def bare_turn_for(
    target: BareTurnTarget,
    mix: TrafficMix,
    args: argparse.Namespace,
    pipeline: dict[str, Any],
    *,
    ramped: dict[str, Any] | None = None,
    out_dir: Path | None = None,
    name: str = "bench",
) -> dict[str, Any]:
    """The bare turn at the pipeline's offered rate (`args.rate`) and at its max (`ramped`: its ramp
    run beside the pipeline's, see `pipeline.bench.runner.ramps`; else a ramp of its own, now), and
    its ratios to the pipeline's figures (`pipeline`: the run's result so far). With `--profile S`,
    py-spy records the bare worker during the first phase (`<name>-bare-pyspy.txt`)."""
    bs, worker, platform = target.stack, target.worker, target.platform
    out: dict[str, Any] = {"topics": target.topics, "partitions": args.partitions}
    profile = None
    if args.profile and out_dir is not None:
        seconds = min(args.profile, max(2.0, args.duration - 2))
        profile = asyncio.create_task(profile_worker(worker.pid or 0, seconds, out_dir / f"{name}-bare-pyspy.txt"))
    same = await run_phase(target, mix, args.rate, args.duration, label="bare turn")
    out["same_rate"] = {**same.data, "timeline": same.timeline, "worker_stats": dict(target.last_stats)}
    if profile is not None:
        out["profile"] = await profile
    if ramped is not None:
        out["max"] = ramped
        out["max_interleaved_with_the_pipeline"] = True
    else:
        out["max"] = await ramp(target, mix, args, label="bare turn ramp")
    out["worker_stats"] = dict(target.last_stats)
    out["platform"] = {"rejected": dict(platform.rejected), "duplicates": platform.duplicates}
    out.update(bare_turn_ratios(pipeline, out))
    log(
        f"bare turn: {out['bare_turn_turns_per_s']} turns/s at {args.rate:g} msg/s, max "
        f"{out['bare_turn_max_turns_per_s']} turns/s, {out['bare_turn_cpu_ms_per_turn']} ms CPU/turn; pipeline / bare "
        f"turns/s {out['ratio_turns_to_bare_turn_max']}, bare / pipeline CPU per turn {out['ratio_cpu_per_turn']}; "
        f"at the same rate, pipeline / bare hop p50 ≤ {out['ratio_hop_p50_max']}, overhead p99 without the busy "
        f"wait {out['ratio_overhead_excluding_busy_wait_p99']}"
    )
    log(
        f"per message: messages per turn at the max, pipeline {out['pipeline_msgs_per_turn_at_max']}, bare "
        f"{out['bare_turn_msgs_per_turn_at_max']}; highest offered rate passed, pipeline ÷ bare "
        f"{out['ratio_max_inbound_msgs']}; bare / pipeline CPU per inbound message {out['ratio_cpu_per_inbound_msg']}; "
        f"event-loop lag mean, pipeline {out['pipeline_loop_lag_mean_ms']} ms, "
        f"bare {out['bare_turn_loop_lag_mean_ms']} ms"
    )
    log(
        format_breakdown(
            out["hop_breakdown"],
            f"hop breakdown at {args.rate:g} msg/s on {bs.broker_kind}, ms (pipeline vs bare turn; ratio = "
            f"pipeline ÷ bare; load average over the pipeline's phase {_loads(pipeline.get('load'))}, over the "
            f"bare turn's {_loads(out.get('same_rate'))})",
        )
    )
    return out


def _loads(phase: dict[str, Any] | None) -> str:
    start, end = (phase or {}).get("loadavg_1m") or (None, None)
    return f"{start} → {end}"


def bare_turn_ratios(pipeline: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    """The ratios (targets ≥ 0.5): pipeline turns/s ÷ bare-turn max turns/s (the pipeline's own max
    when `--mode max` ran, else its turns/s at the offered rate, a lower bound), and bare-turn CPU per
    turn ÷ pipeline CPU per turn at the same offered rate."""
    load = pipeline.get("load") or {}
    same = bare.get("same_rate") or {}
    pipeline_tps = (load.get("throughput") or {}).get("turns_per_s")
    pipeline_max = (pipeline.get("max") or {}).get("max_turns_per_s")
    bare_tps = (same.get("throughput") or {}).get("turns_per_s")
    bare_ramp = bare.get("max") or {}
    bare_max = bare_ramp.get("max_turns_per_s")
    pipeline_cpu = (load.get("cpu") or {}).get("worker_ms_per_turn")
    bare_cpu = (same.get("cpu") or {}).get("worker_ms_per_turn")
    pipeline_best = pipeline_max if pipeline_max is not None else pipeline_tps
    basis = (
        "pipeline max (ramp) ÷ bare-turn max (ramp)"
        if pipeline_max is not None
        else "pipeline turns/s at the offered rate (not its max: run --mode max) ÷ bare-turn max (ramp)"
    )
    if bare_ramp and not bare_ramp.get("ceiling_found"):
        basis += "; the bare turn passed every ramp step, so its max is a lower bound (more --ramp-steps)"

    def ratio(a: float | None, b: float | None) -> float | None:
        return _ratio(a, b, 3)

    pipeline_ramp = pipeline.get("max") or {}
    return {
        **same_rate_latency_ratios(load.get("latency_ms") or {}, same.get("latency_ms") or {}),
        **message_ratios(load, same, pipeline_ramp, bare_ramp),
        "bare_turn_turns_per_s": bare_tps,
        "bare_turn_max_turns_per_s": bare_max,
        "bare_turn_cpu_ms_per_turn": bare_cpu,
        "bare_turn_cpu_ms_per_turn_at_max": bare_ramp.get("max_worker_cpu_ms_per_turn"),
        "pipeline_turns_per_s": pipeline_tps,
        "pipeline_max_turns_per_s": pipeline_max,
        "pipeline_cpu_ms_per_turn": pipeline_cpu,
        "ratio_turns_at_same_rate": ratio(pipeline_tps, bare_tps),
        "ratio_turns_to_bare_turn_max": ratio(pipeline_best, bare_max),
        "ratio_turns_basis": basis,
        "ratio_cpu_per_turn": ratio(bare_cpu, pipeline_cpu),
        # What a ready callback waits for its worker's loop, on average, at the same offered rate:
        # every await on a reply (a produce's acknowledgement, a fetch, Redis) pays it.
        "pipeline_loop_lag_mean_ms": (load.get("cpu") or {}).get("worker_loop_lag_mean_ms"),
        "bare_turn_loop_lag_mean_ms": (same.get("cpu") or {}).get("worker_loop_lag_mean_ms"),
    }


def message_ratios(
    load: dict[str, Any], same: dict[str, Any], pipeline_ramp: dict[str, Any], bare_ramp: dict[str, Any]
) -> dict[str, Any]:
    """The same comparison per message. Turns/s and CPU per turn depend on how many messages a turn
    answers: where one side merges more of a chat's messages into a turn (ingest's merge, a busier
    hold), it makes fewer turns of the same messages, and its turns/s falls while it does no less.
    So: messages per turn at each side's max; the highest offered rate each ramp passed (messages/s);
    and worker CPU per inbound message at the same offered rate (bare ÷ pipeline, like CPU per turn)."""

    def at_max(ramp: dict[str, Any]) -> float | None:
        steps = ramp.get("steps") or []
        best = max(steps, key=lambda s: s.get("turns_per_s") or 0.0) if steps else {}
        return _ratio(best.get("inbound_msgs_per_s"), best.get("turns_per_s"), 2)

    pipeline_msg_cpu = (load.get("cpu") or {}).get("worker_ms_per_inbound_msg")
    bare_msg_cpu = (same.get("cpu") or {}).get("worker_ms_per_inbound_msg")
    pipeline_max_msgs = pipeline_ramp.get("max_inbound_msgs_per_s")
    bare_max_msgs = bare_ramp.get("max_inbound_msgs_per_s")
    return {
        "pipeline_msgs_per_turn_at_max": at_max(pipeline_ramp),
        "bare_turn_msgs_per_turn_at_max": at_max(bare_ramp),
        "pipeline_max_inbound_msgs_per_s": pipeline_max_msgs,
        "bare_turn_max_inbound_msgs_per_s": bare_max_msgs,
        "ratio_max_inbound_msgs": _ratio(pipeline_max_msgs, bare_max_msgs, 3),
        "ratio_cpu_per_inbound_msg": _ratio(bare_msg_cpu, pipeline_msg_cpu, 3),
    }


def _ratio(a: float | None, b: float | None, digits: int) -> float | None:
    return round(a / b, digits) if a is not None and b else None


# The stages that are one Kafka hop each (the agent's think time and the busy-policy hold are not).
KAFKA_HOPS = ("ingress->ingest", "ingest->dispatch_in", "stream->render", "render->delivered")


def same_rate_latency_ratios(pipeline: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's latency over the bare turn's at the same offered rate: the same I/O, producer
    and consumer settings and machine load, so what remains is the pipeline's own cost. (The bare
    chain's figures in `limit` are taken alone on the machine, at a lower rate, with `acks=1` and
    `linger_ms=1`.)"""

    def p(figures: dict[str, Any], *path: str) -> float | None:
        value: Any = figures
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, (int, float)) else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return _ratio(a, b, 2)

    hops = {
        hop: {
            "pipeline_p50_ms": p(pipeline, "stages", hop, "p50"),
            "bare_turn_p50_ms": p(bare, "stages", hop, "p50"),
            "ratio_p50": ratio(p(pipeline, "stages", hop, "p50"), p(bare, "stages", hop, "p50")),
        }
        for hop in KAFKA_HOPS
    }
    own = "pipeline_overhead_excluding_busy_wait"
    return {
        "same_rate_hops": hops,
        # Each hop split into produce, broker + fetch, step, queue and handle (pipeline/bench/hops.py).
        "hop_breakdown": compare_breakdowns(pipeline.get("hop_parts") or {}, bare.get("hop_parts") or {}),
        "ratio_hop_p50_max": max((h["ratio_p50"] for h in hops.values() if h["ratio_p50"] is not None), default=None),
        "ratio_overhead_p50": ratio(p(pipeline, "pipeline_overhead", "p50"), p(bare, "pipeline_overhead", "p50")),
        "ratio_overhead_p99": ratio(p(pipeline, "pipeline_overhead", "p99"), p(bare, "pipeline_overhead", "p99")),
        "ratio_overhead_excluding_busy_wait_p99": ratio(p(pipeline, own, "p99"), p(bare, own, "p99")),
    }
