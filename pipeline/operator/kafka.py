"""The operator tools' Kafka side: reading by partition and offset with no consumer group (so never
committing, never joining, never moving the workers' group), and producing a replay at a bounded
rate. aiokafka's public API only; works on Tansu and Apache Kafka alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from pipeline.kafka import topic_partitions
from pipeline.topics import DEADLETTER

from .letters import Letter, Planned

#: How long a read may take before the tool gives up (the broker is slow or unreachable).
READ_TIMEOUT_SECONDS = 60.0


def _consumer(bootstrap: str, fetch_max_wait_ms: int) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,  # no group: nothing committed, no rebalance of anyone's partitions
        enable_auto_commit=False,
        fetch_max_wait_ms=fetch_max_wait_ms,
        auto_offset_reset="earliest",
    )


async def _read_ranges(
    consumer: AIOKafkaConsumer,
    ranges: dict[TopicPartition, tuple[int, int | None]],
    timeout: float,
    each: Callable[[ConsumerRecord[bytes, bytes]], None],
) -> None:
    """`each(record)` for every record in [start, end) of each partition, in order per partition.
    Records are not kept: a large topic is read in the memory of one fetch.

    End None: to the end of the partition, which is where a fetch finds nothing more once the
    broker's reported end is reached. The reported end alone is not enough: Tansu's ListOffsets can
    answer an end some records short of what fetches return (measured: 19,990 after 20,000 acked
    records), and a reader stopping there would miss the newest."""
    reported = await consumer.end_offsets(list(ranges)) if ranges else {}
    wanted = {tp: span for tp, span in ranges.items() if span[1] is None or span[0] < span[1]}
    if not wanted:
        return
    consumer.assign(list(wanted))
    for tp, (first, _end) in wanted.items():
        consumer.seek(tp, first)
    deadline = time.monotonic() + timeout
    pending = dict(wanted)
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {sorted(str(tp) for tp in pending)} took longer than {timeout:.0f} s")
        batch = await consumer.getmany(*pending, timeout_ms=500)
        for tp in list(pending):
            end = pending[tp][1]
            messages = batch.get(tp, [])
            for message in messages:
                if end is None or message.offset < end:
                    each(message)
            position = await consumer.position(tp)
            if (end is not None and position >= end) or (end is None and not messages and position >= reported[tp]):
                del pending[tp]


async def _collect(
    consumer: AIOKafkaConsumer, ranges: dict[TopicPartition, tuple[int, int | None]], timeout: float
) -> list[ConsumerRecord[bytes, bytes]]:
    records: list[ConsumerRecord[bytes, bytes]] = []
    await _read_ranges(consumer, ranges, timeout, records.append)
    return records


async def read_dead_letters(
    bootstrap: str,
    keep: Callable[[Letter], bool] = lambda _letter: True,
    *,
    fetch_max_wait_ms: int = 20,
    topic: str = DEADLETTER,
) -> tuple[int, list[Letter]]:
    """How many records `im.deadletter` holds now, and those of them `keep` keeps, oldest first
    per partition."""
    partitions = await topic_partitions(bootstrap, topic, timeout=10.0)
    tps = [TopicPartition(topic, p) for p in partitions]
    kept: list[Letter] = []
    total = 0

    def each(record: ConsumerRecord[bytes, bytes]) -> None:
        nonlocal total
        total += 1
        letter = Letter.of(record.partition, record.offset, record.timestamp, record.value)
        if keep(letter):
            kept.append(letter)

    consumer = _consumer(bootstrap, fetch_max_wait_ms)
    await consumer.start()
    try:
        starts = await consumer.beginning_offsets(tps)
        await _read_ranges(consumer, {tp: (starts[tp], None) for tp in tps}, READ_TIMEOUT_SECONDS, each)
    finally:
        await consumer.stop()
    kept.sort(key=lambda letter: (letter.partition, letter.offset))
    return total, kept


async def read_record(
    bootstrap: str, topic: str, partition: int, offset: int, *, fetch_max_wait_ms: int = 20
) -> ConsumerRecord[bytes, bytes] | None:
    """The record at `offset`, or None when the topic no longer (or never) held it."""
    if partition not in await _partitions(bootstrap, topic):
        return None
    tp = TopicPartition(topic, partition)
    consumer = _consumer(bootstrap, fetch_max_wait_ms)
    await consumer.start()
    try:
        start, end = (await consumer.beginning_offsets([tp]))[tp], (await consumer.end_offsets([tp]))[tp]
        if not start <= offset < end:
            return None
        found = await _collect(consumer, {tp: (offset, offset + 1)}, READ_TIMEOUT_SECONDS)
    finally:
        await consumer.stop()
    return next((r for r in found if r.offset == offset), None)


async def _partitions(bootstrap: str, topic: str) -> set[int]:
    try:
        return set(await topic_partitions(bootstrap, topic, timeout=5.0))
    except Exception:  # the topic does not exist (ConsumeTimeoutError) or cannot be described
        return set()


async def last_records_of_key(
    bootstrap: str,
    topic: str,
    key: str,
    *,
    count: int = 3,
    scan_limit: int = 50_000,
    step: int = 2_000,
    fetch_max_wait_ms: int = 20,
) -> list[ConsumerRecord[bytes, bytes]]:
    """The last `count` records of `key` in `topic`, oldest first: read back from the end of the
    key's partition (the producers' murmur2 partitioner) in steps, at most `scan_limit` records."""
    partitions = sorted(await _partitions(bootstrap, topic))
    if not partitions:
        return []
    partition = DefaultPartitioner()(key.encode(), partitions, partitions)
    tp = TopicPartition(topic, partition)
    consumer = _consumer(bootstrap, fetch_max_wait_ms)
    await consumer.start()
    try:
        start, end = (await consumer.beginning_offsets([tp]))[tp], (await consumer.end_offsets([tp]))[tp]
        floor = max(start, end - scan_limit)
        found: list[ConsumerRecord[bytes, bytes]] = []
        upper: int | None = None  # the first chunk: to the end (past a reported end that lags)
        while (upper is None or upper > floor) and len(found) < count:
            lower = max(floor, (end if upper is None else upper) - step)
            chunk = await _collect(consumer, {tp: (lower, upper)}, READ_TIMEOUT_SECONDS)
            mine = [r for r in chunk if r.key is not None and r.key.decode("utf-8", "replace") == key]
            found = sorted(mine, key=lambda r: r.offset) + found
            upper = lower
    finally:
        await consumer.stop()
    return found[-count:]


@dataclass
class Sent:
    planned: Planned
    partition: int
    offset: int


async def produce_replay(
    bootstrap: str,
    planned: Sequence[Planned],
    *,
    rate: float,
    idempotence: bool,
    progress: Callable[[int, int], None] = lambda _done, _total: None,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> list[Sent]:
    """Produce each sendable record (acks=all, one at a time, in order) at most `rate` per second,
    so a replay does not flood a platform; `progress(done, total)` after each."""
    sendable = [p for p in planned if p.sendable]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=idempotence, linger_ms=0)
    await producer.start()
    sent: list[Sent] = []
    try:
        started = time.monotonic()
        for index, item in enumerate(sendable):
            due = started + index / rate
            wait = due - time.monotonic()
            if wait > 0:
                await sleep(wait)
            assert item.topic is not None and item.value is not None
            meta = await producer.send_and_wait(
                item.topic, value=item.value, key=item.key.encode() if item.key is not None else None
            )
            sent.append(Sent(item, meta.partition, meta.offset))
            progress(index + 1, len(sendable))
    finally:
        await producer.stop()
    return sent
