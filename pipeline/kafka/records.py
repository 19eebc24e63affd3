"""Raw produce/consume helpers for tests and tools (bytes in, ``ConsumerRecord`` out)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.structs import RecordMetadata

from pipeline.kafka.admin import admin_client, list_topics
from pipeline.kafka.exceptions import ConsumeTimeoutError

#: Small fetch wait so helpers return promptly on Tansu (which holds every fetch for the full wait);
#: harmless on Apache Kafka (it answers early).
DEFAULT_FETCH_MAX_WAIT_MS = 20

Headers = Sequence[tuple[str, bytes]]


async def produce(
    bootstrap: str,
    topic: str,
    key: bytes | str | None,
    value: bytes | None,
    *,
    partition: int | None = None,
    headers: Headers | None = None,
    timestamp_ms: int | None = None,
) -> RecordMetadata:
    """Produce one record (acks=all) and return its metadata. A str key is UTF-8 encoded."""
    return (
        await produce_many(
            bootstrap, topic, [(key, value)], partition=partition, headers=headers, timestamp_ms=timestamp_ms
        )
    )[0]


async def produce_many(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | str | None, bytes | None]],
    *,
    partition: int | None = None,
    headers: Headers | None = None,
    timestamp_ms: int | None = None,
) -> list[RecordMetadata]:
    """Produce ``(key, value)`` pairs in order with one producer; returns their metadata."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        futures = []
        for key, value in records:
            raw_key = key.encode() if isinstance(key, str) else key
            futures.append(
                await producer.send(
                    topic,
                    value=value,
                    key=raw_key,
                    partition=partition,
                    headers=list(headers) if headers else None,
                    timestamp_ms=timestamp_ms,
                )
            )
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


async def consume_until(
    bootstrap: str,
    topic: str,
    predicate: Callable[[ConsumerRecord[bytes, bytes]], bool],
    timeout: float = 10.0,
    *,
    from_beginning: bool = True,
    fetch_max_wait_ms: int = DEFAULT_FETCH_MAX_WAIT_MS,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read ``topic`` (all partitions, no consumer group) until ``predicate(record)`` is true.

    Returns every record read, the matching one last. Records are in order per partition only.
    Raises :class:`ConsumeTimeoutError` (with ``.records``) after ``timeout`` seconds.
    No group means no rebalance wait and no committed offsets left behind.
    """
    seen: list[ConsumerRecord[bytes, bytes]] = []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=fetch_max_wait_ms,
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        partitions = await topic_partitions(bootstrap, topic, max(deadline - loop.time(), 0.1))
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ConsumeTimeoutError(
                    f"no matching record in {topic!r} after {timeout}s ({len(seen)} records read)", seen
                )
            batch = await consumer.getmany(timeout_ms=int(min(remaining, 0.5) * 1000))
            for _tp, messages in batch.items():
                for message in messages:
                    seen.append(message)
                    if predicate(message):
                        return seen
    finally:
        await consumer.stop()


async def consume_count(
    bootstrap: str, topic: str, count: int, timeout: float = 10.0, **kwargs: int | bool
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read until ``count`` records have been seen (from the beginning by default)."""
    counter = {"n": 0}

    def enough(_record: ConsumerRecord[bytes, bytes]) -> bool:
        counter["n"] += 1
        return counter["n"] >= count

    if count <= 0:
        return []
    return await consume_until(bootstrap, topic, enough, timeout, **kwargs)  # type: ignore[arg-type]


async def topic_partitions(bootstrap: str, topic: str, timeout: float = 10.0) -> list[int]:
    """Partition ids of ``topic``, waiting up to ``timeout`` for it to exist (never auto-creates it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with admin_client(bootstrap) as admin:
        while True:
            if topic in await list_topics(admin):
                for meta in await admin.describe_topics([topic]):
                    parts = meta.get("partitions") or []
                    if not meta.get("error_code") and parts:
                        return sorted(p["partition"] for p in parts)
            if loop.time() > deadline:
                raise ConsumeTimeoutError(f"topic {topic!r} does not exist", [])
            await asyncio.sleep(0.05)
