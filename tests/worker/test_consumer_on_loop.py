"""The driver's consumer runs on the app's event loop: no consumer thread, and records a stage
receives were fetched by an aiokafka consumer bound to the running loop (against a real broker)."""

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
from pipeline.worker.driver import BatchConsumer, ConsumerThread

from .apps import driver_app

pytestmark = pytest.mark.integration


class Collect:
    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.threads: set[int] = set()
        self.got = asyncio.Event()

    async def deliver(self, messages: Sequence[Message]) -> None:
        self.threads.add(threading.get_ident())
        self.values.extend(cast(bytes, m.value) for m in messages)  # every record here has a value
        if len(self.values) >= 3:
            self.got.set()


async def test_the_consumer_fetches_on_the_apps_loop_without_a_thread(
    kafka_broker: TansuBroker | ApacheKafka, unique_name: Callable[..., str], tmp_path: Path
) -> None:
    topic = unique_name("loop")
    await apply_topics(kafka_broker.bootstrap, [TopicSpec(topic, 2)])
    app = driver_app(unique_name("loop"), kafka_broker, tmp_path)
    sink = Collect()
    app.add_sink(topic, sink, partitions=2)
    threads_before = {t.ident for t in threading.enumerate()}
    await app.start()
    try:
        consumer = app.consumer
        assert isinstance(consumer, BatchConsumer)
        service = consumer._thread
        assert isinstance(service, ConsumerThread)
        assert service.thread_loop is asyncio.get_running_loop()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            for n in range(3):
                await producer.send_and_wait(topic, f"v{n}".encode(), key=b"k")
        finally:
            await producer.stop()
        await asyncio.wait_for(sink.got.wait(), timeout=60)
        assert sorted(sink.values) == [b"v0", b"v1", b"v2"]
        assert sink.threads == {threading.get_ident()}
        kafka = service._consumer
        assert kafka is not None and kafka._client._loop is asyncio.get_running_loop()
        # Nothing committed yet: after a rebalance's seek the partition is read from its start, not
        # from where the fetcher had got to (aiokafka seeks only committed offsets above 0).
        (tp,) = [tp for tp in kafka.assignment() if await kafka.position(tp) > 0]
        await service.seek_to_committed()
        assert await kafka.position(tp) == 0
        # A commit naming only partitions no longer assigned (computed before a rebalance took
        # them) commits nothing instead of crashing the worker on aiokafka's ValueError({}).
        assert await service.commit({TP(unique_name("gone"), 0): 5}) is False
        assert await service.commit({tp: 0}) is True
        assert not service.should_stop
        # aiohttp/DNS executors aside, the app started no thread that runs a loop of its own.
        new = [t for t in threading.enumerate() if t.ident not in threads_before]
        assert not [t for t in new if type(t).__name__ == "WorkerThread"], new
    finally:
        await app.stop()
