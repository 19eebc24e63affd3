"""A commit never passes a record no stage acknowledged: Faust commits past a single unacknowledged
record at the head of a partition (faust-streaming#606); the driver holds the commit and reads
the partition again from that record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from faust.types import TP, Message
from intervaltree import IntervalTree
from prometheus_client import REGISTRY

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.kafka import TopicSpec, apply_topics
from pipeline.worker.app import SwitchboardApp
from pipeline.worker.driver import BatchConsumer, skips_unacknowledged

from .apps import driver_app


def gaps(*spans: tuple[int, int]) -> IntervalTree:
    tree = IntervalTree()
    for begin, end in spans:
        tree.addi(begin, end)
    return tree


@pytest.mark.parametrize(
    ("committed", "acked", "gap", "skips"),
    [
        (5, {6, 7}, (), True),  # the one record Faust lets a commit pass
        (5, {7, 8}, (), True),
        (5, {5, 6, 7}, (), False),  # acknowledged from the committed offset on
        (5, {6, 7}, ((5, 6),), False),  # offset 5 is not in the log
        (5, set(), (), False),  # nothing to commit
        (None, {6, 7}, (), False),  # no start known: nothing to hold to
        (0, {1}, (), True),  # offset 0 counts (Faust's check skips a falsy committed offset)
    ],
)
def test_a_commit_that_would_pass_an_unacknowledged_record(
    committed: int | None, acked: set[int], gap: tuple[tuple[int, int], ...], skips: bool
) -> None:
    assert skips_unacknowledged(committed, acked, gaps(*gap)) is skips


def held(topic: str) -> float:
    return REGISTRY.get_sample_value("switchboard_commits_held_total", {"topic": topic}) or 0.0


class AckAllBut:
    """A stage that acknowledges every record except one offset, the first time it sees it."""

    def __init__(self, app: SwitchboardApp, skip: int) -> None:
        self.app = app
        self.skip = skip
        self.seen: list[int] = []
        self.committed_at_redelivery: int | None = -1
        self.gap_at_redelivery: bool | None = None
        self.redelivered = asyncio.Event()

    async def deliver(self, messages: Sequence[Message]) -> None:
        for message in messages:
            first_time = message.offset not in self.seen
            self.seen.append(message.offset)
            if message.offset == self.skip and first_time:
                continue  # handed to no stage: as if a rebalance had cut its delivery short
            if message.offset == self.skip:
                consumer = self.app.consumer
                assert isinstance(consumer, BatchConsumer)
                self.committed_at_redelivery = consumer.committed_offset(message.tp)
                # The record is in the log: not taken for a gap, which a commit may pass.
                self.gap_at_redelivery = consumer._gap[message.tp].overlaps_point(message.offset)
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
    monkeypatch.setattr(BatchConsumer, "read_again_after", 0.0)
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
        assert sink.gap_at_redelivery is False
        assert held(topic) > before
        consumer = app.consumer
        assert isinstance(consumer, BatchConsumer)
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
