"""Broker refusals of an idempotent producer, told as one line naming the setting."""

from __future__ import annotations

from aiokafka.errors import ClusterAuthorizationFailedError, KafkaTimeoutError, UnknownError

from pipeline.embedded import TansuBroker
from pipeline.kafka.refusals import idempotence_problem, idempotence_refusal


async def test_tansu_refuses_an_idempotent_producer(tansu_broker: TansuBroker) -> None:
    problem = await idempotence_problem(tansu_broker.bootstrap)
    assert problem is not None and "SWITCHBOARD_KAFKA_IDEMPOTENCE=false" in problem, problem


def test_each_known_refusal_names_what_to_do() -> None:
    unauthorized = idempotence_refusal(ClusterAuthorizationFailedError(), "sasl://u:pw@k:9092")
    assert unauthorized is not None
    assert "IdempotentWrite" in unauthorized and "SWITCHBOARD_KAFKA_IDEMPOTENCE=false" in unauthorized
    assert "sasl://u:***@k:9092" in unauthorized and ":pw@" not in unauthorized  # shown redacted
    unknown = idempotence_refusal(UnknownError(), "k:9092")
    assert unknown is not None and "does not support idempotent producers" in unknown
    assert idempotence_refusal(KafkaTimeoutError(), "k:9092") is None  # not a refusal: left as it is
