"""TansuBroker lifecycle and the Tansu behaviours the rest of Switchboard designs around."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.embedded import ApacheKafka, TansuBroker, port_open
from pipeline.kafka import admin_client, consume_count, produce
from pipeline.kafka.testing import TopicFactory


async def test_start_health_stop(tmp_path: Path) -> None:
    broker = TansuBroker(run_dir=tmp_path)
    await broker.start()
    try:
        assert broker.is_running
        assert await broker.health()
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert broker.log_path.exists()
        async with admin_client(broker.bootstrap) as admin:
            assert await admin.list_topics() is not None
    finally:
        await broker.stop()
    assert not broker.is_running
    assert not await broker.health()
    assert not port_open("127.0.0.1", broker.port)
    await broker.stop()  # idempotent


def test_sync_context_manager_cleans_run_dir() -> None:
    with TansuBroker() as broker:
        run_dir = broker.run_dir
        assert port_open("127.0.0.1", broker.port)
    assert not broker.is_running
    assert not run_dir.exists()


async def test_restart_keeps_port_but_loses_data(
    tansu_broker_factory: Callable[..., Awaitable[TansuBroker]], unique_name: Callable[..., str]
) -> None:
    """Memory storage: a restarted Tansu is empty. Broker-restart fault tests need Apache Kafka."""
    broker = await tansu_broker_factory()
    topic = unique_name("restart")
    await produce(broker.bootstrap, topic, b"k", b"v")  # auto-created by Produce
    port = broker.port
    await broker.restart()
    assert broker.port == port
    async with admin_client(broker.bootstrap) as admin:
        assert topic not in await admin.list_topics()


async def test_kill_then_start(tansu_broker_factory: Callable[..., Awaitable[TansuBroker]]) -> None:
    broker = await tansu_broker_factory()
    await broker.kill()
    assert not broker.is_running
    await broker.start()
    assert await broker.health()


async def test_metadata_request_auto_creates_topics(tansu_broker: TansuBroker, unique_name: Callable[..., str]) -> None:
    """Naming an unknown topic in a Metadata request creates it on Tansu (check_topics must not)."""
    topic = unique_name("meta")
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu_broker.bootstrap)
    await admin.start()
    try:
        await admin.describe_topics([topic])
        assert topic in await admin.list_topics()
    finally:
        await admin.close()


async def test_consumer_group_commit_and_committed(
    tansu_broker: TansuBroker, topic_factory: TopicFactory, unique_name: Callable[..., str]
) -> None:
    if topic_factory.bootstrap != tansu_broker.bootstrap:
        pytest.skip("Tansu-only characterisation")
    topic = await topic_factory(partitions=2)
    for i in range(6):
        await produce(tansu_broker.bootstrap, topic, f"k{i}", b"v", partition=i % 2)
    group = unique_name("g")
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=tansu_broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **tansu_broker.recommended_consumer_config,
    )
    await consumer.start()
    try:
        seen = 0
        async with asyncio.timeout(20):
            while seen < 6:
                batch = await consumer.getmany(timeout_ms=500)
                seen += sum(len(v) for v in batch.values())
        await consumer.commit()
        assert await consumer.committed(TopicPartition(topic, 0)) == 3
    finally:
        await consumer.stop()


async def test_first_join_waits_half_the_session_timeout(
    kafka_broker: TansuBroker | ApacheKafka, topic_factory: TopicFactory, unique_name: Callable[..., str]
) -> None:
    """Tansu answers a group's first JoinGroup after session_timeout_ms / 2 (Kafka: at once).

    Both sides are checked against the hold, not against a speed: on Tansu the join takes at least
    the hold (a lower bound, which load cannot break); on Apache Kafka the session timeout is made
    long (30 s) and the join must come well before its half would have elapsed, so only a broker
    that holds the join (or a hang) fails it, not a slow machine.
    """
    session_timeout_ms = 4000 if kafka_broker.kind == "tansu" else 30_000
    hold = session_timeout_ms / 2 / 1000
    topic = await topic_factory()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=unique_name("join"),
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=300,
        fetch_max_wait_ms=20,
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await consumer.start()
    try:
        async with asyncio.timeout(hold + 20):
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=50)
        took = loop.time() - t0
    finally:
        await consumer.stop()
    if kafka_broker.kind == "tansu":
        assert took >= 0.9 * hold, took
    else:
        assert took < hold, took


async def test_fetch_wait_latency(kafka_broker: TansuBroker | ApacheKafka, topic_factory: TopicFactory) -> None:
    """Tansu does not answer a pending fetch when data arrives; Apache Kafka does.

    Measured on Tansu with fetch_max_wait_ms=1500: single-hop latency spread over ~1-740 ms
    (median ~240). With a 2000 ms wait, 8 records at random moments all arriving within 150 ms has
    probability ~0.1 % on Tansu (a lower bound: load only makes it likelier to hold). On Kafka
    every one takes a few ms, but that figure is not asserted: the wait is made long (20 s) and
    every record must arrive before half of it would have elapsed, which only a broker that holds
    the fetch (or a hang) fails.
    """
    fetch_wait_ms = 2000 if kafka_broker.kind == "tansu" else 20_000
    topic = await topic_factory(partitions=1)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=fetch_wait_ms
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=0)
    await consumer.start()
    await producer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        loop = asyncio.get_running_loop()
        latencies = []
        for delay in (0.31, 0.17, 0.43, 0.11, 0.29, 0.37, 0.23, 0.19):
            await asyncio.sleep(delay)
            t0 = loop.time()
            await producer.send_and_wait(topic, b"x", partition=0)
            got = await consumer.getmany(tp, timeout_ms=fetch_wait_ms + 5000)
            assert got.get(tp), "record not received"
            latencies.append((loop.time() - t0) * 1000)
    finally:
        await producer.stop()
        await consumer.stop()
    if kafka_broker.kind == "tansu":
        assert max(latencies) > 150, latencies
    else:
        assert max(latencies) < fetch_wait_ms / 2, latencies


async def test_consume_helpers_on_tansu(tansu_broker: TansuBroker, unique_name: Callable[..., str]) -> None:
    topic = unique_name("helpers")
    await produce(tansu_broker.bootstrap, topic, b"a", b"1")
    records = await consume_count(tansu_broker.bootstrap, topic, 1, timeout=10)
    assert records[0].value == b"1"
