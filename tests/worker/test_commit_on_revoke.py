"""What the stages acknowledged is committed when a rebalance revokes the partitions, before their
next owner reads them (against a real broker)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from faust.types import TP, Message

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.kafka import TopicSpec, apply_topics
from pipeline.worker.app import SwitchboardApp
from pipeline.worker.driver import SwitchboardConsumer

from .apps import driver_app

pytestmark = pytest.mark.integration


class AckAll:
    def __init__(self, app: SwitchboardApp) -> None:
        self.app = app
        self.offsets: list[int] = []
        self.changed = asyncio.Event()

    async def deliver(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self.offsets.append(message.offset)
            self.app.consumer.ack(message)
        self.changed.set()


async def test_acknowledged_records_are_committed_when_the_partition_is_revoked(
    kafka_broker: TansuBroker | ApacheKafka,
    unique_name: Callable[..., str],
    tmp_path: Path,
    kafka_consumer_config: dict[str, int],
) -> None:
    topic = unique_name("revoke")
    await apply_topics(kafka_broker.bootstrap, [TopicSpec(topic, 1)])
    group = unique_name("revoke")
    # Neither the timer nor the count commits during the test: only the revocation can.
    app = driver_app(
        group,
        kafka_broker,
        tmp_path,
        broker_commit_interval=3600.0,
        broker_commit_every=1_000_000,
        broker_session_timeout=4.0,
        broker_heartbeat_interval=0.5,
        broker_rebalance_timeout=10.0,
        stream_wait_empty=False,  # as the worker's app: Faust's revocation does not commit then
    )
    sink = AckAll(app)
    app.add_sink(topic, sink, partitions=1)
    await app.start()
    other: AIOKafkaConsumer | None = None
    try:
        consumer = app.consumer
        assert isinstance(consumer, SwitchboardConsumer)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            for n in range(3):
                await producer.send_and_wait(topic, f"v{n}".encode(), key=b"k")
        finally:
            await producer.stop()
        while len(sink.offsets) < 3:
            sink.changed.clear()
            await asyncio.wait_for(sink.changed.wait(), timeout=60)
        assert consumer.committed_offset(TP(topic, 0)) is None  # nothing committed yet
        # A second member joins the group: the rebalance revokes the worker's partition (range
        # assignment then gives the one partition to one of the two).
        other = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_broker.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            partition_assignment_strategy=[RangePartitionAssignor],  # the worker's
            **kafka_consumer_config,
        )
        await other.start()
        tp = TopicPartition(topic, 0)
        for _ in range(600):
            committed = await other.committed(tp)
            if committed is not None:
                break
            await asyncio.sleep(0.1)
        assert committed == 3
        assert sink.offsets == [0, 1, 2]
    finally:
        if other is not None:
            await other.stop()
        await app.stop()
