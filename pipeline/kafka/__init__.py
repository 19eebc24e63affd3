"""Kafka administration: declarative topics, drift checks, raw record helpers, consumer lag."""

from pipeline.kafka.admin import TopicState, admin_client, describe_topic_states, wait_for_topics
from pipeline.kafka.declare import ApplyReport, Drift, DriftKind, TopicSpec, apply_topics, check_topics
from pipeline.kafka.exceptions import (
    BrokerUnavailableError,
    ConsumeTimeoutError,
    KafkaAdminError,
    TopicApplyError,
    UnsupportedByBrokerError,
)
from pipeline.kafka.lag import GroupLag, LagReader, PartitionLag, consumer_lag
from pipeline.kafka.records import consume_count, consume_until, produce, produce_many, topic_partitions

__all__ = [
    "ApplyReport",
    "BrokerUnavailableError",
    "ConsumeTimeoutError",
    "Drift",
    "DriftKind",
    "GroupLag",
    "KafkaAdminError",
    "LagReader",
    "PartitionLag",
    "TopicApplyError",
    "TopicSpec",
    "TopicState",
    "UnsupportedByBrokerError",
    "admin_client",
    "apply_topics",
    "check_topics",
    "consume_count",
    "consume_until",
    "consumer_lag",
    "describe_topic_states",
    "produce",
    "produce_many",
    "topic_partitions",
    "wait_for_topics",
]
