"""Apache Kafka supervisor: runs only with SWITCHBOARD_TEST_BROKERS including ``kafka``."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from pipeline.embedded import ApacheKafka, apache_kafka
from pipeline.kafka import TopicSpec, apply_topics, consume_count, produce


async def test_started_and_healthy(apache_kafka: ApacheKafka) -> None:
    assert await apache_kafka.health()
    assert apache_kafka.last_start_seconds is not None
    assert apache_kafka.last_start_seconds < apache_kafka.start_timeout


async def test_restart_keeps_data(apache_kafka: ApacheKafka, unique_name: Callable[..., str]) -> None:
    topic = unique_name("persist")
    await apply_topics(apache_kafka.bootstrap, [TopicSpec(topic, 2)])
    await produce(apache_kafka.bootstrap, topic, b"k", b"before-restart")
    port = apache_kafka.port
    await apache_kafka.restart()
    assert apache_kafka.port == port
    records = await consume_count(apache_kafka.bootstrap, topic, 1, timeout=30)
    assert records[0].value == b"before-restart"


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # `kafka-storage format -t -xyz…` reads the id as an option and fails: about 1 start in 64.
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url "-A…"
    plain = uuid.UUID(bytes=bytes(16))
    draws = iter([dashed, dashed, plain])
    monkeypatch.setattr(apache_kafka.uuid, "uuid4", lambda: next(draws))
    assert apache_kafka.random_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"
