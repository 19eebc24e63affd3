"""The limit: a bare aiokafka consume→produce chain (bench/broker_latency.py) on the same broker.

Same number of topics as the pipeline (im.inbound → session.input → session.events →
im.outbound.<platform>: 4 topics, each record consumed once), same partition count. Its records/s,
divided by the pipeline's measured Kafka records per turn, is the turns/s the broker and client
allow here; the pipeline's turns/s is reported as a share of that.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from pipeline.bench.measure import pct, proc_cpu_seconds, self_cpu_seconds, summary
from pipeline.kafka import TopicSpec, apply_topics


def broker_latency_module() -> ModuleType:
    """bench/broker_latency.py of this checkout (the reference chain, reused, not copied)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "broker_latency.py"
    if "switchboard_broker_latency" in sys.modules:
        return sys.modules["switchboard_broker_latency"]
    spec = importlib.util.spec_from_file_location("switchboard_broker_latency", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["switchboard_broker_latency"] = module
    spec.loader.exec_module(module)
    return module


async def bare_chain(
    bootstrap: str,
    *,
    topics: int = 4,
    partitions: int = 8,
    messages: int = 20_000,
    fetch_wait_ms: int = 20,
    payload_bytes: int = 400,
    latency_rate: float | None = None,
    latency_seconds: float = 8.0,
    broker_pid: int | None = None,
    drain_seconds: float = 120.0,
    linger_ms: int = 1,
    acks: int | str = 1,
    throughput: bool = True,
) -> dict[str, Any]:
    """The chain's latency at `latency_rate` (if given) and its throughput (if `throughput`)."""
    bl = broker_latency_module()
    run_id = uuid.uuid4().hex[:6]
    names = [f"bench-{run_id}-t{i}" for i in range(topics)]
    hops = topics - 1
    await apply_topics(bootstrap, [TopicSpec(t, partitions) for t in names])
    from aiokafka import AIOKafkaProducer

    consumers, producers, tasks = [], [], []
    sink = bl.Sink(hops=[[] for _ in range(hops)])
    out: dict[str, Any] = {
        "topics": topics,
        "partitions": partitions,
        "fetch_max_wait_ms": fetch_wait_ms,
        "linger_ms": linger_ms,
        "acks": acks,
    }
    try:
        for i in range(1, topics):
            c = await bl.assigned_consumer(bootstrap, names[i - 1], partitions, fetch_wait_ms)
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=linger_ms, acks=acks)
            await p.start()
            consumers.append(c)
            producers.append(p)
            tasks.append(asyncio.create_task(bl.stage(c, p, names[i])))
        sink_consumer = await bl.assigned_consumer(bootstrap, names[-1], partitions, fetch_wait_ms)
        consumers.append(sink_consumer)
        tasks.append(asyncio.create_task(bl.sink_loop(sink_consumer, sink, hops)))
        source = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=linger_ms, acks=acks)
        await source.start()
        producers.append(source)
        # -- latency at a given rate (open loop, random gaps) ----------------------------------------
        if latency_rate:
            n = max(10, int(latency_rate * latency_seconds))
            sink.reset(n, record=True)
            rng = random.Random(7)
            start = time.monotonic()
            for i in range(n):
                at = start + i / latency_rate + rng.uniform(-0.4, 0.4) / latency_rate
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await source.send(names[0], value=bl.STAMP.pack(bl.now_ns()), key=str(i % 256).encode())
            try:
                await asyncio.wait_for(sink.done.wait(), timeout=30)
            except TimeoutError:
                pass
            out["latency_rate_msgs_per_s"] = latency_rate
            out["latency_ms"] = summary(list(sink.e2e))
            all_hops = [x for h in sink.hops for x in h]
            out["per_hop_ms"] = {"p50": round(pct(all_hops, 50), 2), "p99": round(pct(all_hops, 99), 2)}
        # -- throughput: blast N records, time until the sink has them all ---------------------------
        if not throughput:
            return out
        sink.reset(messages, record=False)
        c0, b0 = self_cpu_seconds(), proc_cpu_seconds(broker_pid)
        start_ns = bl.now_ns()
        payload = b"x" * payload_bytes
        pending = []
        for i in range(messages):
            pending.append(await source.send(names[0], value=payload, key=str(i % 1024).encode()))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        try:
            await asyncio.wait_for(sink.done.wait(), timeout=drain_seconds)
        except TimeoutError:
            out["incomplete"] = f"{sink.received}/{messages}"
        secs = max((sink.last_ns - start_ns) / 1e9, 1e-6)
        out.update(
            {
                "messages": sink.received,
                "seconds": round(secs, 3),
                "msgs_per_s": round(sink.received / secs, 1),
                "records_per_s": round(sink.received * topics / secs, 1),
                "cpu_client_s": round(self_cpu_seconds() - c0, 2),
                "cpu_broker_s": round(proc_cpu_seconds(broker_pid) - b0, 2) if broker_pid else None,
            }
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in producers:
            await p.stop()
        for c in consumers:
            await c.stop()
    return out


async def bare_one_hop(
    bootstrap: str,
    *,
    partitions: int = 8,
    messages: int = 20_000,
    fetch_wait_ms: int = 20,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """A bare one-hop consume rate (the reference for filtered group messages)."""
    return await bare_chain(
        bootstrap,
        topics=1,
        partitions=partitions,
        messages=messages,
        fetch_wait_ms=fetch_wait_ms,
        broker_pid=broker_pid,
    )
