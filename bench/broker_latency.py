"""Bare aiokafka consume→produce chain: per-hop latency at a low rate and max throughput.

The floor every pipeline figure is compared with, and the measurement behind the fetch-wait
settings: Tansu holds each Fetch for the consumer's whole ``fetch_max_wait_ms`` even when records
arrive, so at low rates every hop waits up to that long; Apache Kafka answers as soon as data comes.

    .venv/bin/python bench/broker_latency.py --fetch-wait-ms 20
    .venv/bin/python bench/broker_latency.py --fetch-wait-ms 1500 --broker kafka

Topics ``t0 → t1 → … → tN``: a source produces to t0, stage i consumes t(i-1) and produces to t(i),
a sink consumes tN. Each stage appends its receive time to the value, so the sink knows every hop's
latency (receive time minus the previous hop's send/receive time; one process, one clock).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import struct
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.kafka import TopicSpec, apply_topics

STAMP = struct.Struct(">q")  # perf_counter_ns stamps appended to the value


def now_ns() -> int:
    return time.perf_counter_ns()


def proc_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


@dataclass
class Sink:
    expected: int = 0
    received: int = 0
    hops: list[list[float]] = field(default_factory=list)  # per hop, ms
    e2e: list[float] = field(default_factory=list)
    first_ns: int = 0
    last_ns: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    record: bool = True

    def reset(self, expected: int, record: bool) -> None:
        self.expected, self.received, self.record = expected, 0, record
        self.e2e.clear()
        for h in self.hops:
            h.clear()
        self.done = asyncio.Event()


async def assigned_consumer(bootstrap: str, topic: str, partitions: int, fetch_wait: int) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=fetch_wait,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:  # resolve the lazy seek now, so records produced from here on are read
        await consumer.position(tp)
    return consumer


async def stage(consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, out_topic: str) -> None:
    while True:
        batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
        for messages in batch.values():
            for m in messages:
                value = (m.value or b"") + STAMP.pack(now_ns())
                await producer.send(out_topic, value=value, key=m.key)


async def sink_loop(consumer: AIOKafkaConsumer, sink: Sink, hops: int) -> None:
    while True:
        batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
        t = now_ns()
        for messages in batch.values():
            for m in messages:
                sink.received += 1
                if sink.received == 1:
                    sink.first_ns = t
                sink.last_ns = t
                if sink.record:
                    v = m.value or b""
                    stamps = [STAMP.unpack_from(v, i * 8)[0] for i in range(len(v) // 8)] + [t]
                    for h in range(hops):
                        sink.hops[h].append((stamps[h + 1] - stamps[h]) / 1e6)
                    sink.e2e.append((stamps[-1] - stamps[0]) / 1e6)
        if sink.expected and sink.received >= sink.expected:
            sink.done.set()


async def run(args: argparse.Namespace) -> None:
    broker: TansuBroker | ApacheKafka | None = None
    bootstrap = args.bootstrap
    broker_pid: int | None = None
    if not bootstrap:
        broker = TansuBroker() if args.broker == "tansu" else ApacheKafka()
        await broker.start()
        bootstrap, broker_pid = broker.bootstrap, broker.pid
    try:
        await _bench(args, bootstrap, broker_pid)
    finally:
        if broker is not None:
            await broker.stop()
            broker.cleanup()


async def _bench(args: argparse.Namespace, bootstrap: str, broker_pid: int | None) -> None:
    run_id = uuid.uuid4().hex[:6]
    topics = [f"bench-{run_id}-t{i}" for i in range(args.topics)]
    hops = len(topics) - 1
    await apply_topics(bootstrap, [TopicSpec(t, args.partitions) for t in topics])
    fw = args.fetch_wait_ms
    stages, producers, tasks = [], [], []
    sink = Sink(hops=[[] for _ in range(hops)])
    for i in range(1, len(topics)):
        c = await assigned_consumer(bootstrap, topics[i - 1], args.partitions, fw)
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=args.linger_ms)
        await p.start()
        stages.append(c)
        producers.append(p)
        # stage i reads t(i-1) and writes t(i); the last topic is read by the sink
        tasks.append(asyncio.create_task(stage(c, p, topics[i])))
    sink_consumer = await assigned_consumer(bootstrap, topics[-1], args.partitions, fw)
    tasks.append(asyncio.create_task(sink_loop(sink_consumer, sink, hops)))
    source = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=args.linger_ms)
    await source.start()
    print(
        f"broker={args.broker if not args.bootstrap else bootstrap} fetch_max_wait_ms={fw} "
        f"topics={len(topics)} hops={hops} partitions={args.partitions}"
    )
    try:
        # -- latency at a low rate: random gaps so sends do not lock onto the fetch cycle ----------
        n = args.latency_messages
        sink.reset(n, record=True)
        rng = random.Random(7)
        for i in range(n):
            await asyncio.sleep(rng.uniform(0.5, 1.5) / args.rate)
            await source.send(topics[0], value=STAMP.pack(now_ns()), key=str(i % 64).encode())
        try:
            await asyncio.wait_for(sink.done.wait(), timeout=30 + hops * fw / 1000 * 3)
        except TimeoutError:
            print(f"  latency: only {sink.received}/{n} records arrived")
        all_hops = [x for h in sink.hops for x in h]
        print(
            f"  latency @~{args.rate:g} msg/s, {len(sink.e2e)} records: per hop p50 {pct(all_hops, 50):.1f} ms"
            f" p99 {pct(all_hops, 99):.1f} ms | end-to-end ({hops} hops) p50 {pct(sink.e2e, 50):.1f} ms"
            f" p99 {pct(sink.e2e, 99):.1f} ms"
        )
        # -- idle CPU: everything subscribed, nothing flowing ----------------------------------------
        c0, b0, t0 = self_cpu_seconds(), proc_cpu_seconds(broker_pid or 0), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        dt = time.monotonic() - t0
        idle_client = (self_cpu_seconds() - c0) / dt * 100
        idle_broker = (proc_cpu_seconds(broker_pid or 0) - b0) / dt * 100 if broker_pid else float("nan")
        print(
            f"  idle ({hops + 1} consumers polling): client CPU {idle_client:.1f}% broker CPU {idle_broker:.1f}%"
            " (of one core)"
        )
        # -- throughput: blast N records, time until the sink has them all ---------------------------
        n = args.throughput_messages
        sink.reset(n, record=False)
        c0, b0 = self_cpu_seconds(), proc_cpu_seconds(broker_pid or 0)
        start = now_ns()
        payload = b"x" * args.payload_bytes
        pending = []
        for i in range(n):
            pending.append(await source.send(topics[0], value=payload, key=str(i % 1024).encode()))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        try:
            await asyncio.wait_for(sink.done.wait(), timeout=args.throughput_timeout)
        except TimeoutError:
            print(f"  throughput: only {sink.received}/{n} records arrived in {args.throughput_timeout}s")
        secs = (sink.last_ns - start) / 1e9
        cpu_client = self_cpu_seconds() - c0
        cpu_broker = proc_cpu_seconds(broker_pid or 0) - b0 if broker_pid else float("nan")
        print(
            f"  throughput: {sink.received} records through {hops} hops in {secs:.2f}s = "
            f"{sink.received / secs:,.0f} msg/s end to end ({sink.received * hops / secs:,.0f} hop-records/s);"
            f" CPU client {cpu_client:.1f}s broker {cpu_broker:.1f}s"
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await source.stop()
        for p in producers:
            await p.stop()
        for c in [*stages, sink_consumer]:
            await c.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fetch-wait-ms", type=int, default=20)
    ap.add_argument("--broker", choices=["tansu", "kafka"], default="tansu", help="embedded broker to start")
    ap.add_argument(
        "--bootstrap",
        default=os.environ.get("SWITCHBOARD_KAFKA_BOOTSTRAP", ""),
        help="use this broker instead of starting one",
    )
    ap.add_argument("--topics", type=int, default=4, help="topics in the chain (hops = topics - 1)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.0, help="msg/s during the latency phase")
    ap.add_argument("--latency-messages", type=int, default=30)
    ap.add_argument("--idle-seconds", type=float, default=5.0)
    ap.add_argument("--throughput-messages", type=int, default=50_000)
    ap.add_argument("--throughput-timeout", type=float, default=120.0)
    ap.add_argument("--payload-bytes", type=int, default=200)
    ap.add_argument("--linger-ms", type=int, default=0)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
