"""produce / consume_until / consume_count round trips."""

from __future__ import annotations

import pytest

from pipeline.kafka import ConsumeTimeoutError, consume_count, consume_until, produce, produce_many
from pipeline.kafka.testing import TopicFactory


async def test_round_trip_with_headers(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = await topic_factory(partitions=3)
    meta = await produce(kafka_bootstrap, topic, "conv-1", b'{"x": 1}', headers=[("trace", b"abc")])
    assert meta.topic == topic and meta.offset == 0
    records = await consume_until(kafka_bootstrap, topic, lambda r: r.key == b"conv-1", timeout=15)
    last = records[-1]
    assert last.value == b'{"x": 1}'
    assert ("trace", b"abc") in list(last.headers)


async def test_consume_count_across_partitions(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = await topic_factory(partitions=4)
    await produce_many(kafka_bootstrap, topic, [(f"k{i}", f"v{i}".encode()) for i in range(20)])
    records = await consume_count(kafka_bootstrap, topic, 20, timeout=15)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(20))
    # same key -> same partition, in order
    by_key: dict[bytes | None, set[int]] = {}
    for r in records:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in by_key.values())


async def test_consume_until_times_out(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = await topic_factory()
    await produce(kafka_bootstrap, topic, None, b"only")
    with pytest.raises(ConsumeTimeoutError) as info:
        await consume_until(kafka_bootstrap, topic, lambda r: r.value == b"never", timeout=1.5)
    assert [r.value for r in info.value.records] == [b"only"]


async def test_topic_factory_names_and_partitions(topic_factory: TopicFactory, kafka_bootstrap: str) -> None:
    from pipeline.kafka import topic_partitions

    a, b = await topic_factory.many(2, partitions=2)
    assert a != b
    assert await topic_partitions(kafka_bootstrap, a) == [0, 1]
    c = await topic_factory(partitions=5, config={"retention.ms": "60000"})
    assert await topic_partitions(kafka_bootstrap, c) == [0, 1, 2, 3, 4]
