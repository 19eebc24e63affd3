"""A commit never passes a record no stage acknowledged (Faust's own offset tracking did, for a
single one at the head of a partition: faust-streaming#606): the driver holds the commit and reads
the partition again from that record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from faust.types import TP, Message
from prometheus_client import REGISTRY

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.kafka import TopicSpec, apply_topics
from pipeline.worker.app import SwitchboardApp
from pipeline.worker.driver import SwitchboardConsumer

from .apps import driver_app


def held(topic: str) -> float:
    return REGISTRY.get_sample_value("switchboard_commits_held_total", {"topic": topic}) or 0.0


class AckAllBut:
    """A stage that acknowledges every record except one offset, the first time it sees it."""

    def __init__(self, app: SwitchboardApp, skip: int) -> None:
        self.app = app
        self.skip = skip
        self.seen: list[int] = []
        self.committed_at_redelivery: int | None = -1
        self.redelivered = asyncio.Event()

    async def deliver(self, messages: Sequence[Message]) -> None:
        for message in messages:
            first_time = message.offset not in self.seen
            self.seen.append(message.offset)
            if message.offset == self.skip and first_time:
                continue  # handed to no stage: as if a rebalance had cut its delivery short
            if message.offset == self.skip:
                consumer = self.app.consumer
                assert isinstance(consumer, SwitchboardConsumer)
                self.committed_at_redelivery = consumer.committed_offset(message.tp)
                self.redelivered.set()
            self.app.consumer.ack(message)


@pytest.mark.integration
@pytest.mark.parametrize("skip", [0, 2])  # 0: before the partition's first commit
async def test_a_record_no_stage_acknowledged_is_read_again_not_committed_past(
    kafka_broker: TansuBroker | ApacheKafka,
    unique_name: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    skip: int,
) -> None:
    monkeypatch.setattr(SwitchboardConsumer, "read_again_after", 0.0)
    topic = unique_name("guard")
    await apply_topics(kafka_broker.bootstrap, [TopicSpec(topic, 1)])
    app = driver_app(unique_name("guard"), kafka_broker, tmp_path, broker_commit_interval=0.2)
    total = 5
    sink = AckAllBut(app, skip=skip)
    app.add_sink(topic, sink, partitions=1)
    before = held(topic)
    await app.start()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            for n in range(total):
                await producer.send_and_wait(topic, f"v{n}".encode(), key=b"k")
        finally:
            await producer.stop()
        await asyncio.wait_for(sink.redelivered.wait(), timeout=60)
        # Nothing was committed past the record while it was unacknowledged.
        assert sink.committed_at_redelivery is None or sink.committed_at_redelivery <= skip
        assert held(topic) > before
        consumer = app.consumer
        assert isinstance(consumer, SwitchboardConsumer)
        tp = TP(topic, 0)
        for _ in range(300):
            if consumer.committed_offset(tp) == total:
                break
            await asyncio.sleep(0.1)
        assert consumer.committed_offset(tp) == total
        # Every record was delivered, and the unacknowledged one again after its first time (how
        # many came before the partition was read again depends on how the broker batches them).
        assert set(sink.seen) == set(range(total))
        first = sink.seen.index(skip)
        assert skip in sink.seen[first + 1 :]
    finally:
        await app.stop()
