"""Errors of the Kafka admin and test helpers."""

from __future__ import annotations

from typing import Any

from pipeline.errors import SwitchboardError


class KafkaAdminError(SwitchboardError, RuntimeError):
    """Base class for pipeline.kafka failures."""


class BrokerUnavailableError(KafkaAdminError):
    """The bootstrap servers could not be reached or did not answer metadata."""


class TopicApplyError(KafkaAdminError):
    """Applying topic specs failed for at least one topic (``report`` holds the details)."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class UnsupportedByBrokerError(KafkaAdminError):
    """The broker does not implement an API we need (e.g. Tansu: AlterConfigs, CreatePartitions)."""


class ConsumeTimeoutError(KafkaAdminError, TimeoutError):
    """``consume_until`` did not see a matching record in time; ``records`` holds what it saw."""

    def __init__(self, message: str, records: list[Any]) -> None:
        super().__init__(message)
        self.records = records
