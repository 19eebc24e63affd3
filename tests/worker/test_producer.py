"""The worker's producer: acks=all always, idempotent unless SWITCHBOARD_KAFKA_IDEMPOTENCE=false."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.settings import Settings
from pipeline.worker.app import create_app
from pipeline.worker.driver import Producer


@pytest.mark.parametrize(("idempotence", "expected"), [(None, True), (False, False)])
def test_worker_producer_waits_for_all_replicas_and_is_idempotent_by_default(
    idempotence: bool | None, expected: bool
) -> None:
    options: dict[str, Any] = {} if idempotence is None else {"kafka_idempotence": idempotence}
    settings = Settings(kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0", **options)
    app = create_app(settings, stages=["ingest"], platforms=[])
    producer = app.producer
    assert isinstance(producer, Producer)
    built = producer.aiokafka_settings()  # what aiokafka's producer is built with
    assert built["acks"] == "all"
    assert built["enable_idempotence"] is expected


@pytest.mark.parametrize(("linger", "expected"), [(None, 0), (7, 7)])
def test_worker_producer_sends_at_once_unless_a_linger_is_set(linger: int | None, expected: int) -> None:
    # aiokafka batches what arrives while a request is in flight; a linger would add itself to every hop.
    options: dict[str, Any] = {} if linger is None else {"kafka_linger_ms": linger}
    settings = Settings(kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0", **options)
    producer = create_app(settings, stages=["ingest"], platforms=[]).producer
    assert isinstance(producer, Producer)
    assert producer.aiokafka_settings()["linger_ms"] == expected


@pytest.mark.parametrize(("batch", "expected"), [(None, 262144), (16384, 16384)])
def test_worker_producer_batches_up_to_the_configured_bytes_per_partition(batch: int | None, expected: int) -> None:
    # One request in flight per broker: a partition's produce rate is at most a batch per round trip.
    options: dict[str, Any] = {} if batch is None else {"kafka_max_batch_bytes": batch}
    settings = Settings(kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0", **options)
    producer = create_app(settings, stages=["ingest"], platforms=[]).producer
    assert isinstance(producer, Producer)
    assert producer.aiokafka_settings()["max_batch_size"] == expected
