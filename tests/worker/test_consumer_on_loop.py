"""The driver's consumer runs on the app's event loop: no consumer thread, and records a stage
receives were fetched on the loop's own thread (against a real broker)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import pytest
from aiokafka import AIOKafkaProducer
from faust.types import TP, Message

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.kafka import TopicSpec, apply_topics
from pipeline.worker.driver import SwitchboardConsumer

from .apps import driver_app

pytestmark = pytest.mark.integration


class Collect:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.threads: set[int] = set()
        self.changed = asyncio.Event()

    async def deliver(self, messages: Sequence[Message]) -> None:
        self.threads.add(threading.get_ident())
        self.messages.extend(messages)
        self.changed.set()

    async def wait_for(self, count: int) -> list[Message]:
        while len(self.messages) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=60)
        return self.messages

    def values(self) -> list[bytes]:
        return [cast(bytes, m.value) for m in self.messages]  # every record here has a value


async def test_the_consumer_fetches_on_the_apps_loop_without_a_thread(
    kafka_broker: TansuBroker | ApacheKafka, unique_name: Callable[..., str], tmp_path: Path
) -> None:
    topic = unique_name("loop")
    await apply_topics(kafka_broker.bootstrap, [TopicSpec(topic, 2)])
    # Commits only when asked: the test says when.
    app = driver_app(unique_name("loop"), kafka_broker, tmp_path, broker_commit_interval=3600.0)
    sink = Collect()
    app.add_sink(topic, sink, partitions=2)
    threads_before = {t.ident for t in threading.enumerate()}
    await app.start()
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
        first = (await sink.wait_for(3))[:3]
        assert sorted(sink.values()) == [b"v0", b"v1", b"v2"]
        assert sink.threads == {threading.get_ident()}
        tp = first[0].tp
        assert {m.tp for m in first} == {tp}  # one key, one partition
        assert consumer.read_offset(tp) == 2
        assert consumer.committed_offset(tp) is None
        # Nothing committed yet: after a rebalance's seek the partition is read from its start, not
        # from where the fetcher had got to (aiokafka seeks only committed offsets above 0).
        assert await consumer.position(tp) == 3
        await consumer.perform_seek()
        assert await consumer.position(tp) == 0
        again = (await sink.wait_for(6))[3:6]
        assert [m.offset for m in again] == [0, 1, 2]
        # Acknowledgements of the first delivery no longer count: the records were read again.
        assert not any(consumer.ack(m) for m in first)
        assert all(consumer.ack(m) for m in again)
        # A commit naming only partitions no longer assigned commits nothing.
        assert await consumer.commit({TP(unique_name("gone"), 0)}) is False
        assert await consumer.commit() is True
        assert consumer.committed_offset(tp) == 3
        assert await consumer.commit() is False  # nothing new acknowledged
        assert not consumer.should_stop
        # aiohttp/DNS executors aside, the app started no thread that runs a loop of its own.
        new = [t for t in threading.enumerate() if t.ident not in threads_before]
        assert not [t for t in new if type(t).__name__ in {"WorkerThread", "ServiceThread"}], new
    finally:
        await app.stop()
