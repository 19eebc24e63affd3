"""Consumer lag reader on every enabled broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from pipeline.kafka import LagReader, consumer_lag, produce
from pipeline.kafka.testing import TopicFactory


async def _commit_via_group(bootstrap: str, group: str, topic: str, consumer_config: dict[str, int], read: int) -> None:
    """Join ``group`` and commit position ``read`` on partition 0."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **consumer_config,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        async with asyncio.timeout(30):
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=200)
        await consumer.commit({tp: OffsetAndMetadata(read, "")})
    finally:
        await consumer.stop()


async def test_lag_committed_vs_high_watermark(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    unique_name: Callable[..., str],
    kafka_consumer_config: dict[str, int],
) -> None:
    topic = await topic_factory(partitions=2)
    for i in range(7):
        await produce(kafka_bootstrap, topic, f"k{i}", b"v", partition=0)
    for i in range(3):
        await produce(kafka_bootstrap, topic, f"k{i}", b"v", partition=1)
    group = unique_name("g")
    await _commit_via_group(kafka_bootstrap, group, topic, kafka_consumer_config, read=4)

    lag = await consumer_lag(kafka_bootstrap, group, [topic])
    by_partition = {p.partition: p for p in lag.partitions}
    assert by_partition[0].committed == 4 and by_partition[0].high_watermark == 7 and by_partition[0].lag == 3
    # nothing committed on partition 1: the whole partition counts as lag
    assert by_partition[1].committed is None and by_partition[1].lag == 3
    assert lag.total == 6 and lag.by_topic() == {topic: 6}

    # without a topic list, only topics where the group committed are reported
    async with LagReader(kafka_bootstrap) as reader:
        discovered = await reader.read(group)
        assert [(p.topic, p.partition) for p in discovered.partitions] == [(topic, 0)]
        await produce(kafka_bootstrap, topic, "k", b"v", partition=0)
        assert (await reader.read(group, [topic])).total == 7


async def test_unknown_group_and_topic(
    kafka_bootstrap: str, topic_factory: TopicFactory, unique_name: Callable[..., str]
) -> None:
    topic = await topic_factory()
    await produce(kafka_bootstrap, topic, "k", b"v")
    lag = await consumer_lag(kafka_bootstrap, unique_name("nobody"), [topic, unique_name("missing")])
    assert [(p.committed, p.lag) for p in lag.partitions] == [(None, 1)]
