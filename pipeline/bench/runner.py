"""The stack under test and one measured load phase."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from pipeline.bench.hops import hop_breakdown
from pipeline.bench.load import (
    Delivery,
    Generator,
    Plan,
    Sent,
    TrafficMix,
    build_plan,
    latency_report,
    read_deliveries,
    series,
)
from pipeline.bench.measure import (
    CpuSetMeter,
    KafkaWatermarks,
    metric_sum,
    proc_cpu_seconds,
    redis_commands,
    redis_commandstats,
    rss_mib,
    scrape_metrics,
    self_cpu_seconds,
)
from pipeline.embedded import ApacheKafka, KafkaCluster, RedisCluster, RedisServer, SentinelTopology, TansuBroker
from pipeline.stack import Stack
from pipeline.state import Keys, LiveMessage, pubsub, redis_py_client
from pipeline.state.redis_url import ClusterTarget, parse_redis_url

BOTS_TOML = """
[[bots]]
platform = "console"
bot_id = "demo"
self_id = "bot"
language = "en"
busy_policy = "merge"

[[bots]]
platform = "console"
bot_id = "queue"
self_id = "bot"
language = "en"
busy_policy = "queue"
"""


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


class DeliveryWatch(Protocol):
    """Replies delivered so far (counted as they arrive)."""

    @property
    def count(self) -> int: ...

    async def stop(self) -> None: ...


class LoadTarget(Protocol):
    """What a load phase drives and reads: the pipeline's stack (`BenchStack`) or the bare turn
    (`pipeline.bench.bare_turn`). In `pids()`, the names starting with `worker` are the processes
    under test (their CPU and RSS are the worker figures); `redis` is None when it uses no Redis."""

    bootstrap: str
    redis: Any
    kafka_prefixes: tuple[str, ...]

    def urls(self) -> list[str]: ...

    def pids(self) -> dict[str, int | None]: ...

    async def counters(self, http: httpx.AsyncClient) -> dict[str, float]:
        """`ingested` (inbound messages taken off the first topic), `streams_open`, and
        `redis_round_trips` (NaN when the worker does not count them)."""
        ...

    async def watch_deliveries(self, bot: str) -> DeliveryWatch: ...

    async def deliveries(self, bot: str, chat_ids: Sequence[str]) -> list[Delivery]: ...


#: what `start_stack(redis=…)` runs the stack's Redis on
REDIS_KINDS = ("single", "cluster", "sentinel")


@dataclass
class BenchStack:
    """A stack the bench owns (or one it attached to: then only `urls`, redis and kafka are known)."""

    redis_url: str
    redis_prefix: str
    bootstrap: str
    app_id: str
    stack: Stack | None = None
    broker: TansuBroker | ApacheKafka | None = None
    #: the replicated cluster, when the stack runs on one (`broker` is then None)
    cluster: KafkaCluster | None = None
    redis_server: RedisServer | None = None
    redis_cluster: RedisCluster | None = None
    redis_sentinel: SentinelTopology | None = None
    attach_urls: list[str] = field(default_factory=list)
    attach_pids: list[int] = field(default_factory=list)
    broker_kind: str = "tansu"
    run_dir: Path | None = None
    redis: Any = None
    settings_env: dict[str, str] = field(default_factory=dict)
    kafka_prefixes: tuple[str, ...] = ("im.", "session.")

    @property
    def keys(self) -> Keys:
        """The stack's key layout (hash-tagged on a cluster)."""
        return Keys(self.redis_prefix, cluster=isinstance(parse_redis_url(self.redis_url), ClusterTarget))

    def urls(self) -> list[str]:
        if self.stack is None:
            return list(self.attach_urls)
        return [w.url for w in self.stack.workers if w.is_running]

    def worker_pids(self) -> list[int]:
        if self.stack is None:
            return list(self.attach_pids)
        return [w.pid for w in self.stack.workers if w.is_running and w.pid]

    @property
    def sim_url(self) -> str | None:
        if self.stack is not None and self.stack.sim is not None:
            return self.stack.sim.url
        base = os.environ.get("SWITCHBOARD_SESSION_BASE_URL", "")
        return base.rsplit("/v1", 1)[0] if base.endswith("/v1") else None

    def pids(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {f"worker{i}": pid for i, pid in enumerate(self.worker_pids())}
        out["broker"] = self.broker.pid if self.broker else None
        if self.cluster is not None:
            out.update(self.cluster.pids())
        out["redis"] = self.redis_server.pid if self.redis_server else None
        out["sim"] = self.stack.sim.pid if self.stack and self.stack.sim else None
        return out

    async def counters(self, http: httpx.AsyncClient) -> dict[str, float]:
        return await worker_counters(self, http)

    async def watch_deliveries(self, bot: str) -> DeliveryWatch:
        counter = DeliveryCounter(self, bot)
        await counter.start()
        return counter

    async def deliveries(self, bot: str, chat_ids: Sequence[str]) -> list[Delivery]:
        return await read_deliveries(self.redis, self.keys, bot, chat_ids)

    async def close(self) -> None:
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if self.stack is not None:
            with contextlib.suppress(Exception):
                await self.stack.stop()
        for part in (self.redis_server, self.redis_cluster, self.redis_sentinel, self.broker, self.cluster):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        if self.cluster is not None:
            self.cluster.cleanup()


async def start_stack(
    *,
    broker: str = "tansu",
    workers: int = 1,
    think: float = 0.0,
    aof: bool = False,
    run_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    partitions: int = 8,
    log_level: str = "WARNING",
    extra_bots: str = "",
    redis: str = "single",
    kafka_nodes: int = 0,
) -> BenchStack:
    """A stack the bench owns: the broker, Redis (`single`: one server; `cluster`: a Redis Cluster of
    3 primaries + 3 replicas; `sentinel`: a primary, a replica and three sentinels, the workers on
    the `redis+sentinel://` URL), the simulator and `workers` workers. `kafka_nodes` > 0: on a
    replicated Apache Kafka cluster of that many nodes (`broker` unused), with topics of
    min(3, nodes) replicas."""
    if redis not in REDIS_KINDS:
        raise ValueError(f"unknown Redis kind {redis!r}: one of {', '.join(REDIS_KINDS)}")
    raise_fd_limit()
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="sb-bench-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "switchboard.toml"
    config.write_text(BOTS_TOML + extra_bots)
    kafka: TansuBroker | ApacheKafka | None = None
    cluster: KafkaCluster | None = None
    node: TansuBroker | ApacheKafka  # the settings the workers need come from a node
    if kafka_nodes > 0:
        broker = f"kafka-cluster-{kafka_nodes}"
        cluster = KafkaCluster(kafka_nodes, run_dir=run_dir / "kafka")
        await cluster.start()
        bootstrap = cluster.bootstrap
        node = cluster.node(1)
    else:
        kafka = node = (
            TansuBroker(run_dir=run_dir / "broker") if broker == "tansu" else ApacheKafka(run_dir=run_dir / "broker")
        )
        await kafka.start()
        bootstrap = kafka.bootstrap
    redis_server: RedisServer | None = None
    redis_cluster: RedisCluster | None = None
    redis_sentinel: SentinelTopology | None = None
    if redis == "cluster":
        redis_cluster = await RedisCluster(aof=aof, run_dir=run_dir / "redis-cluster").start()
        redis_url = redis_cluster.url
    elif redis == "sentinel":
        redis_sentinel = await SentinelTopology(aof=aof, run_dir=run_dir / "redis-sentinel").start()
        redis_url = redis_sentinel.url()
    else:
        redis_server = await RedisServer(aof=aof, run_dir=run_dir / "redis").start()
        redis_url = redis_server.url
    prefix = f"bench{uuid.uuid4().hex[:6]}:"
    app_id = f"switchboard-bench-{uuid.uuid4().hex[:6]}"
    env = {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_KAFKA_BOOTSTRAP": bootstrap,
        "SWITCHBOARD_KAFKA_FETCH_MAX_WAIT_MS": str(node.recommended_fetch_max_wait_ms),
        "SWITCHBOARD_KAFKA_IDEMPOTENCE": str(node.supports_idempotence).lower(),
        "SWITCHBOARD_REPLICATION_FACTOR": str(min(3, kafka_nodes) if kafka_nodes else 1),
        "SWITCHBOARD_KAFKA_SESSION_TIMEOUT_SECONDS": "6",
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_REDIS_PREFIX": prefix,
        "SWITCHBOARD_PARTITIONS": str(partitions),
        "SWITCHBOARD_APP_ID": app_id,
        "SWITCHBOARD_LOG_LEVEL": log_level,
        **(extra_env or {}),
    }
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_")}
    for key in saved:
        del os.environ[key]  # the developer's settings must not leak into the bench stack
    stack = Stack(settings_env=env, web_port=0, think=think, run_dir=run_dir)
    bs = BenchStack(
        redis_url=redis_url,
        redis_prefix=prefix,
        bootstrap=bootstrap,
        app_id=app_id,
        stack=stack,
        broker=kafka,
        cluster=cluster,
        redis_server=redis_server,
        redis_cluster=redis_cluster,
        redis_sentinel=redis_sentinel,
        broker_kind=broker,
        run_dir=run_dir,
        settings_env=env,
    )
    try:
        await stack.start(workers=0)
        for _ in range(workers):
            await stack.add_worker()
    except BaseException:
        os.environ.update(saved)
        await bs.close()
        raise
    os.environ.update(saved)
    bs.redis = redis_py_client(redis_url, decode_responses=True)
    return bs


async def attach_stack(urls: Sequence[str], pids: Sequence[int]) -> BenchStack:
    from pipeline.settings import Settings

    settings = Settings()
    if not settings.redis_url or not settings.kafka_bootstrap:
        raise SystemExit("--attach needs SWITCHBOARD_REDIS_URL and SWITCHBOARD_KAFKA_BOOTSTRAP of the stack")
    bs = BenchStack(
        redis_url=settings.redis_url,
        redis_prefix=settings.redis_prefix,
        bootstrap=settings.kafka_bootstrap,
        app_id=settings.app_id,
        attach_urls=list(urls),
        attach_pids=list(pids),
        broker_kind="attached",
    )
    bs.redis = redis_py_client(settings.redis_url, decode_responses=True)
    return bs


class LiveTap:
    """Reads the console's live channel (every console bot's deliveries, one pubsub subscription, no
    polling) and hands each message's data to `on_message`. A broken connection (Redis restarted, a
    primary lost) is subscribed again; what it missed meanwhile is lost, and `resubscribed` counts it."""

    def __init__(self, bs: BenchStack, bot: str) -> None:
        self.bs = bs
        self.bot = bot
        self.resubscribed = 0
        self._task: asyncio.Task[None] | None = None

    def on_message(self, data: Any) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        channel = f"{self.bs.redis_prefix}console-live"
        subscription = await pubsub(self.bs.redis)
        await subscription.subscribe(channel)

        async def loop() -> None:
            nonlocal subscription
            try:
                while True:
                    try:
                        msg = await subscription.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    except Exception:  # the connection broke: subscribe again
                        self.resubscribed += 1
                        await asyncio.sleep(0.5)
                        with contextlib.suppress(Exception):
                            await subscription.aclose()
                            subscription = await pubsub(self.bs.redis)
                            await subscription.subscribe(channel)
                        continue
                    if msg is not None:
                        self.on_message(msg.get("data"))
            finally:
                with contextlib.suppress(Exception):
                    await subscription.aclose()

        self._task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class DeliveryCounter(LiveTap):
    """Counts one bot's console deliveries as they are published."""

    def __init__(self, bs: BenchStack, bot: str) -> None:
        super().__init__(bs, bot)
        self.count = 0

    def on_message(self, data: Any) -> None:
        if _live_bot(data) == self.bot:
            self.count += 1


def _live_bot(data: Any) -> str | None:
    try:
        return LiveMessage.parse(data).bot_id
    except (ValueError, TypeError):
        return None


REDIS_ROUND_TRIPS = "switchboard_redis_round_trips_total"
LOOP_STALLS = "switchboard_event_loop_stalls_total"  # the worker's event loop held for 1 s or more
LOOP_LAG = "switchboard_event_loop_lag_seconds"  # how late a 100 ms timer fired (pipeline/worker/loopwatch.py)


async def worker_counters(bs: BenchStack, http: httpx.AsyncClient) -> dict[str, float]:
    """Summed over the workers. `redis_round_trips` is NaN while no worker exports the counter."""
    totals = dict.fromkeys(("ingested", "filtered", "triggered", "streams_open", "egress_sent"), 0.0)
    totals["redis_round_trips"] = math.nan
    totals["loop_stalls"] = math.nan
    totals["loop_lag_seconds"] = totals["loop_lag_samples"] = 0.0
    for url in bs.urls():
        m = await scrape_metrics(url, http)
        filtered = metric_sum(m, "switchboard_inbound_filtered_total")
        triggered = metric_sum(m, "switchboard_turns_triggered_total")
        dedup = metric_sum(m, "switchboard_inbound_deduplicated_total")
        totals["filtered"] += filtered
        totals["triggered"] += triggered
        totals["ingested"] += filtered + triggered + dedup
        totals["streams_open"] += metric_sum(m, "switchboard_sse_streams_open")
        totals["egress_sent"] += metric_sum(m, "switchboard_egress_total", outcome="sent")
        if any(key.partition("{")[0] == REDIS_ROUND_TRIPS for key in m):
            counted = 0.0 if math.isnan(totals["redis_round_trips"]) else totals["redis_round_trips"]
            totals["redis_round_trips"] = counted + metric_sum(m, REDIS_ROUND_TRIPS)
        totals["loop_lag_seconds"] += metric_sum(m, LOOP_LAG + "_sum")
        totals["loop_lag_samples"] += metric_sum(m, LOOP_LAG + "_count")
        if any(key.partition("{")[0] == LOOP_STALLS for key in m):
            counted = 0.0 if math.isnan(totals["loop_stalls"]) else totals["loop_stalls"]
            totals["loop_stalls"] = counted + metric_sum(m, LOOP_STALLS)
    return totals


def mean_lag_ms(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The workers' mean event-loop lag between two `counters` readings (None without samples)."""
    samples = after.get("loop_lag_samples", 0.0) - before.get("loop_lag_samples", 0.0)
    if samples <= 0:
        return None
    return round((after.get("loop_lag_seconds", 0.0) - before.get("loop_lag_seconds", 0.0)) / samples * 1000, 3)


@dataclass
class PhaseResult:
    label: str
    rate: float
    duration: float
    plan: Plan
    deliveries: list[Delivery]
    data: dict[str, Any]
    timeline: list[dict[str, float]]


async def warm_up(bs: LoadTarget, mix: TrafficMix, *, wait_s: float = 120.0) -> None:
    """One triggering message per conversation (so sessions exist), then wait for the replies."""
    plan = build_plan(mix, 1.0, 1.0)
    plan.messages, plan.offsets = [], []
    for i, (chat_id, chat_type) in enumerate(plan.chats):
        body: dict[str, Any] = {
            "chat_id": chat_id,
            "chat_type": chat_type,
            "user_id": "u0",
            "user_name": "U0",
            "text": "warm [sim:think=0]",
            "message_id": f"warm-{chat_id}",
        }
        if chat_type == "group":
            body["mentions"] = ["bot"]
        plan.messages.append(Sent(f"warm-{chat_id}", chat_id, chat_type, True, 0.0, json.dumps(body).encode()))
        plan.offsets.append(i / 200.0)
    counter = await bs.watch_deliveries(mix.bot)
    gen = Generator(plan, bs.urls)
    gen.start()
    await gen.wait()
    deadline = time.monotonic() + wait_s
    while counter.count < len(plan.messages) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    await counter.stop()
    log(f"warm-up: {counter.count}/{len(plan.messages)} conversations answered")


async def run_phase(
    bs: LoadTarget,
    mix: TrafficMix,
    rate: float,
    duration: float,
    *,
    label: str = "load",
    drain_timeout: float = 60.0,
    quiet: float | None = None,
    seed: int = 1,
    progress: bool = True,
) -> PhaseResult:
    """Open-loop load at `rate` messages/s for `duration` s, then drain; every figure of one run."""
    plan = build_plan(mix, rate, duration, seed=seed)
    sent_by_id = {s.msg_id: s for s in plan.messages}
    http = httpx.AsyncClient(timeout=5)
    kafka = KafkaWatermarks(bs.bootstrap)
    await kafka.start()
    pids = bs.pids()
    counter = await bs.watch_deliveries(mix.bot)
    k0 = await kafka.by_topic(bs.kafka_prefixes)
    r0 = await redis_commands(bs.redis) if bs.redis is not None else 0
    rc0 = await redis_commandstats(bs.redis) if bs.redis is not None else {}
    w0 = await bs.counters(http)
    cpu0 = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
    self0 = self_cpu_seconds()
    t0 = time.monotonic()
    t0_ms = time.time() * 1000
    load0 = os.getloadavg()[0]
    gen = Generator(plan, bs.urls)
    gen.start()
    timeline: list[dict[str, float]] = []
    last = {"sent": 0.0, "acked": 0.0, "delivered": 0.0, "ingested": w0["ingested"], "t": t0}
    last_cpu = dict(cpu0)
    quiet = quiet if quiet is not None else max(3.0, 3 * (mix.think or 0.0))
    stable_since = None
    last_count = -1
    load_end = None
    ingest_done: float | None = None
    while True:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        dt = now - last["t"]
        w = await bs.counters(http)
        pids_now = bs.pids()
        cpu_now = {name: proc_cpu_seconds(pid) for name, pid in pids_now.items()}
        worker_cpu = sum(
            (cpu_now[n] - last_cpu.get(n, cpu_now[n]))
            for n in cpu_now
            if n.startswith("worker") and not math.isnan(cpu_now[n])
        )
        row = {
            "t": round(now - t0, 2),
            "sent_per_s": (gen.stats.sent - last["sent"]) / dt,
            "acked_per_s": (gen.stats.acked - last["acked"]) / dt,
            "ingested_per_s": (w["ingested"] - last["ingested"]) / dt,
            "delivered_per_s": (counter.count - last["delivered"]) / dt,
            "worker_cpu_pct": worker_cpu / dt * 100,
            "worker_rss_mib": sum(rss_mib(p) for n, p in pids_now.items() if n.startswith("worker")),
            "errors": gen.stats.errors,
            "streams_open": w["streams_open"],
        }
        timeline.append(row)
        last = {
            "sent": gen.stats.sent,
            "acked": gen.stats.acked,
            "delivered": counter.count,
            "ingested": w["ingested"],
            "t": now,
        }
        last_cpu = cpu_now
        if progress:
            log(
                f"[{label} {row['t']:5.0f}s] sent {row['sent_per_s']:6.0f}/s acked {row['acked_per_s']:6.0f}/s "
                f"ingested {row['ingested_per_s']:6.0f}/s replies {row['delivered_per_s']:5.0f}/s "
                f"worker CPU {row['worker_cpu_pct']:4.0f}% RSS {row['worker_rss_mib']:5.0f} MiB "
                f"streams {row['streams_open']:.0f} errors {gen.stats.errors}"
            )
        if ingest_done is None and gen.stats.done and w["ingested"] - w0["ingested"] >= gen.stats.acked:
            ingest_done = now - t0
        if gen.stats.done and load_end is None:
            load_end = now
            stable_since = now
        if load_end is not None:
            if counter.count != last_count or w["ingested"] - w0["ingested"] < gen.stats.acked:
                last_count = counter.count
                stable_since = now
            if now - (stable_since or now) >= quiet or now - load_end > drain_timeout:
                break
    wall = time.monotonic() - t0
    pids_end = bs.pids()
    cpu1 = {name: proc_cpu_seconds(pid) for name, pid in pids_end.items()}
    self1 = self_cpu_seconds()
    r1 = await redis_commands(bs.redis) if bs.redis is not None else 0
    rc1 = await redis_commandstats(bs.redis) if bs.redis is not None else {}
    k1 = await kafka.by_topic(bs.kafka_prefixes)
    w1 = await bs.counters(http)
    await counter.stop()
    await kafka.stop()
    await http.aclose()
    gen_stats = gen.stats
    deliveries = [d for d in await bs.deliveries(mix.bot, [c for c, _ in plan.chats]) if d.delivered_at >= t0_ms]
    replies = [d for d in deliveries if d.kind == "reply"]
    notices = [d for d in deliveries if d.kind == "notice"]
    lat = latency_report(deliveries, sent_by_id)
    send_seconds = max(duration, 1e-6)
    steady_from = t0_ms + min(2000.0, duration * 200)
    steady_to = t0_ms + duration * 1000
    steady_turns = sum(1 for d in replies if steady_from <= d.delivered_at <= steady_to)
    steady_seconds = max((steady_to - steady_from) / 1000, 1e-6)
    turns = len(replies)
    triggering = sum(1 for s in plan.messages if s.triggers)
    worker_cpu = sum(cpu1[n] - cpu0.get(n, cpu1[n]) for n in cpu1 if n.startswith("worker") and not math.isnan(cpu1[n]))
    kafka_records = sum(k1.values()) - sum(k0.values())
    kafka_by_topic = {t: k1.get(t, 0) - k0.get(t, 0) for t in k1}
    n_workers = max(1, len([n for n in cpu1 if n.startswith("worker")]))
    data: dict[str, Any] = {
        "label": label,
        "target_rate_msgs_per_s": rate,
        # The machine's 1-minute load average as the phase started and ended: phases compared with
        # each other (the pipeline's and the bare turn's) ran one after the other, maybe not alike.
        "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "duration_s": duration,
        "wall_s": round(wall, 2),
        "ingest_seconds": round(ingest_done, 2) if ingest_done else None,
        "workers": n_workers,
        "messages": {
            "planned": len(plan.messages),
            "sent": gen_stats.sent,
            "accepted": gen_stats.acked,
            "failed": gen_stats.failed,
            "http_errors": gen_stats.errors,
            "triggering": triggering,
            "filtered": len(plan.messages) - triggering,
            "ingested": int(w1["ingested"] - w0["ingested"]),
        },
        "turns": turns,
        "notices": len(notices),
        "throughput": {
            "inbound_msgs_per_s": round(gen_stats.acked / send_seconds, 1),
            "ingested_msgs_per_s": round((w1["ingested"] - w0["ingested"]) / max(wall, 1e-6), 1),
            "turns_per_s": round(steady_turns / steady_seconds, 1),
            "turns_per_s_overall": round(turns / max(wall, 1e-6), 1),
            "turns_per_s_per_worker": round(steady_turns / steady_seconds / n_workers, 1),
            "inbound_msgs_per_s_per_worker": round(gen_stats.acked / send_seconds / n_workers, 1),
        },
        "latency_ms": {
            "end_to_end": lat.end_to_end,
            "client_end_to_end": lat.client_end_to_end,
            "agent": lat.agent,
            "pipeline_overhead": lat.overhead,
            "busy_wait": lat.busy_wait,
            "pipeline_overhead_excluding_busy_wait": lat.overhead_excluding_busy_wait,
            "ingress_ack": lat.ingress_ack,
            "stages": lat.stages,
            # Each Kafka hop's parts (pipeline/bench/hops.py), where the records carry the stamps.
            "hop_parts": hop_breakdown(deliveries),
        },
        "cpu": {
            "seconds": {n: round(cpu1[n] - cpu0.get(n, cpu1[n]), 2) for n in cpu1},
            "worker_ms_per_turn": round(worker_cpu * 1000 / turns, 3) if turns else None,
            "worker_ms_per_inbound_msg": round(worker_cpu * 1000 / gen_stats.acked, 3) if gen_stats.acked else None,
            "worker_pct_of_core": round(worker_cpu / wall * 100, 1),
            "generator_thread_seconds": round(gen_stats.cpu_seconds, 2),
            "generator_pct_of_core": round(gen_stats.cpu_seconds / max(gen_stats.wall_seconds, 1e-6) * 100, 1),
            "generator_us_per_msg": round(gen_stats.cpu_seconds * 1e6 / max(gen_stats.sent, 1), 1),
            "bench_process_seconds": round(self1 - self0, 2),
            "generator_behind_max_ms": round(gen_stats.behind_max_ms, 1),
            "worker_loop_stalls": _delta_or_none(w0.get("loop_stalls", math.nan), w1.get("loop_stalls", math.nan)),
            # What a ready callback waited for the loop, on average (every await on a reply pays it).
            "worker_loop_lag_mean_ms": mean_lag_ms(w0, w1),
        },
        "memory": {"worker_rss_mib": {n: round(rss_mib(p), 1) for n, p in pids_end.items() if n.startswith("worker")}},
        "redis": _redis_figures(
            r1 - r0, rc0, rc1, w1["redis_round_trips"] - w0["redis_round_trips"], turns, gen_stats.acked
        )
        if bs.redis is not None
        else None,
        "kafka": {
            "records": kafka_records,
            "records_by_topic": kafka_by_topic,
            "records_per_turn": round(kafka_records / turns, 2) if turns else None,
            "records_per_turn_by_topic": {t: round(n / turns, 2) for t, n in kafka_by_topic.items()} if turns else {},
            "records_per_inbound_msg": round(kafka_records / gen_stats.acked, 2) if gen_stats.acked else None,
        },
    }
    return PhaseResult(label, rate, duration, plan, deliveries, data, timeline)


def _delta_or_none(before: float, after: float) -> int | None:
    return None if math.isnan(before) or math.isnan(after) else int(after - before)


def _redis_figures(
    commands: int, before: dict[str, int], after: dict[str, int], round_trips: float, turns: int, inbound: int
) -> dict[str, Any]:
    """Commands (what Redis executed, Lua scripts' calls included) and round trips (requests the
    workers sent: a command, a pipeline or a script call each; "n/a" while not counted)."""
    return {
        "commands": commands,
        "ops_per_turn": round(commands / turns, 2) if turns else None,
        "ops_per_inbound_msg": round(commands / inbound, 2) if inbound else None,
        "round_trips": None if math.isnan(round_trips) else int(round_trips),
        "round_trips_per_turn": "n/a" if math.isnan(round_trips) or not turns else round(round_trips / turns, 2),
        "per_turn_by_command": {
            name: round((calls - before.get(name, 0)) / turns, 2)
            for name, calls in sorted(after.items(), key=lambda kv: before.get(kv[0], 0) - kv[1])[:15]
            if turns and calls - before.get(name, 0) > 0
        },
    }


async def ramp(
    bs: LoadTarget,
    mix: TrafficMix,
    args: argparse.Namespace,
    label: str = "ramp",
    cpu_sets: CpuSetMeter | None = None,
) -> dict[str, Any]:
    """Open-loop steps of rising rate (same conversations) until p99, backlog or errors blow up,
    then `--ramp-refine` steps between the last rate that passed and the first that failed (see
    `RampRates`). With `cpu_sets`, each step also records how busy those CPU sets were, whoever
    used them."""
    (result,) = await ramps([(label, bs)], mix, args, cpu_sets=cpu_sets)
    return result


# One ramp step: (label, target, rate, the step's index in its ramp) → `ramp_step`'s figures.
StepRunner = Callable[[str, LoadTarget, float, int], Awaitable[dict[str, Any]]]


async def ramps(
    targets: Sequence[tuple[str, LoadTarget]],
    mix: TrafficMix,
    args: argparse.Namespace,
    cpu_sets: CpuSetMeter | None = None,
    *,
    run_step: StepRunner | None = None,
) -> list[dict[str, Any]]:
    """`ramp` of several targets (label, target) at once, interleaved: in each round every target
    whose ramp goes on runs its next step (the same rate while they all pass), the first of the
    round taking turns. Maxes measured minutes apart differed 2x on this machine for the same code;
    interleaved, each rate of one side is measured within a step of the other's."""

    async def measured(label: str, target: LoadTarget, rate: float, index: int) -> dict[str, Any]:
        if cpu_sets is not None:
            cpu_sets.start()
        phase = await run_phase(
            target,
            mix,
            rate,
            args.step_seconds,
            label=f"{label} {rate:.0f}/s",
            drain_timeout=max(10.0, args.step_seconds),
            seed=100 + index,
        )
        return ramp_step(phase.data, rate, args.max_p99_ms, cpu_sets)

    step_at = run_step or measured
    steps: list[list[dict[str, Any]]] = [[] for _ in targets]
    rates = [RampRates(args.ramp_start, args.ramp_factor, args.ramp_steps, args.ramp_refine) for _ in targets]
    going = list(range(len(targets)))
    round_number = 0
    while going:
        first = round_number % len(going)
        for t in going[first:] + going[:first]:
            label, target = targets[t]
            rate = next(rates[t], None)
            if rate is None:
                going.remove(t)
                continue
            step = await step_at(label, target, rate, len(steps[t]))
            steps[t].append(step)
            log(f"{label}: {step}")
            rates[t].record(step["ok"])
        round_number += 1
    return [ramp_result(s, r, args) for s, r in zip(steps, rates, strict=True)]


def ramp_result(steps: list[dict[str, Any]], rates: RampRates, args: argparse.Namespace) -> dict[str, Any]:
    """A ramp's steps (by rate) and its max: the highest rate that passed."""
    passed = [s for s in steps if s["ok"]]
    best = max(passed, key=lambda s: float(s["offered_msgs_per_s"])) if passed else None
    return {
        "steps": sorted(steps, key=lambda s: s["offered_msgs_per_s"]),
        "max_turns_per_s": best["turns_per_s"] if best else None,
        "max_inbound_msgs_per_s": best["inbound_msgs_per_s"] if best else None,
        "max_offered_msgs_per_s": best["offered_msgs_per_s"] if best else None,
        "max_worker_cpu_ms_per_turn": best["worker_cpu_ms_per_turn"] if best else None,
        # False: every step passed, the max is only a lower bound (more --ramp-steps would go higher).
        "ceiling_found": any(not s["ok"] for s in steps),
        # The max lies below this factor of it (--ramp-factor, narrowed by each refining step).
        "resolution_factor": round(rates.resolution, 3),
        "criteria": {
            "e2e_p99_ms_max": args.max_p99_ms,
            "backlog": "ingested ≥ 99% of accepted after the drain",
            "errors": "≤ 1% webhook errors",
        },
    }


class RampRates:
    """The rates a ramp offers: `start` times `factor` per step until a step fails (at most
    `steps`), then `refine` steps, each at the geometric mean of the highest rate that passed and
    the lowest that failed. A 1.5x ramp finds a max to within 1.5x; one refining step to within
    1.22x, two to 1.11x (measured maxes otherwise jump by whole steps: 0.67, 1.0, 1.5 of another's)."""

    def __init__(self, start: float, factor: float, steps: int, refine: int) -> None:
        self._next: float | None = start
        self._factor = factor
        self._steps_left = steps
        self._refine_left = refine
        self._passed: float | None = None  # the highest rate that passed
        self._failed: float | None = None  # the lowest rate that failed

    def __iter__(self) -> RampRates:
        return self

    def __next__(self) -> float:
        if self._next is None:
            raise StopIteration
        return self._next

    def record(self, ok: bool) -> None:
        """The step at the rate just given passed (`ok`) or failed: choose the next rate, if any."""
        rate = self._next
        assert rate is not None
        if ok:
            self._passed = rate
        else:
            self._failed = rate
        if self._failed is None:  # still rising
            self._steps_left -= 1
            self._next = rate * self._factor if self._steps_left > 0 else None
        elif self._passed is not None and self._refine_left > 0:
            self._refine_left -= 1
            self._next = math.sqrt(self._passed * self._failed)
        else:
            self._next = None

    @property
    def resolution(self) -> float:
        """How far above the max found the true one may lie (a factor)."""
        if self._passed is None or self._failed is None:
            return self._factor
        return self._failed / self._passed


def ramp_step(d: dict[str, Any], rate: float, max_p99_ms: float, cpu_sets: CpuSetMeter | None = None) -> dict[str, Any]:
    """One ramp step's figures from its phase, and whether it passed."""
    p99 = d["latency_ms"]["end_to_end"]["p99"]
    msgs = d["messages"]
    backlog_ok = msgs["ingested"] >= 0.99 * msgs["accepted"]
    errors_ok = msgs["failed"] == 0 and msgs["http_errors"] <= 0.01 * max(1, msgs["sent"])
    latency_ok = p99 is not None and p99 <= max_p99_ms
    return {
        "offered_msgs_per_s": round(rate, 1),
        "inbound_msgs_per_s": d["throughput"]["inbound_msgs_per_s"],
        "turns_per_s": d["throughput"]["turns_per_s"],
        "e2e_p50_ms": d["latency_ms"]["end_to_end"]["p50"],
        "e2e_p99_ms": p99,
        "overhead_p99_ms": d["latency_ms"]["pipeline_overhead"]["p99"],
        "worker_cpu_ms_per_turn": d["cpu"]["worker_ms_per_turn"],
        "worker_cpu_pct": d["cpu"]["worker_pct_of_core"],
        # A stall shows here (and its stacks in the worker's log), not only as a p99.
        "worker_loop_stalls": d["cpu"]["worker_loop_stalls"],
        # What else was busy: a step can fail on the broker, the simulator or the generator.
        "cpu_pct_by_process": {
            name: round(seconds / max(d["wall_s"], 1e-6) * 100, 1)
            for name, seconds in {
                **d["cpu"]["seconds"],
                "generator": d["cpu"]["generator_thread_seconds"],
                # the rest of the bench process: its meters and the delivery counter
                "bench_rest": d["cpu"]["bench_process_seconds"] - d["cpu"]["generator_thread_seconds"],
            }.items()
            if seconds is not None and not math.isnan(seconds)
        },
        "stages_p50_ms": {k: v.get("p50") for k, v in d["latency_ms"]["stages"].items()},
        "cpu_sets_busy": cpu_sets.stop() if cpu_sets is not None else None,
        "ok": backlog_ok and errors_ok and latency_ok,
        "why_not": [w for w, ok in (("backlog", backlog_ok), ("errors", errors_ok), ("p99", latency_ok)) if not ok],
    }


def phase_series(result: PhaseResult) -> list[tuple[float, float, float]]:
    start = min((s.intended_ms for s in result.plan.messages if s.intended_ms), default=0.0)
    return series(result.deliveries, start)
