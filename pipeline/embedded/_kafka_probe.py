"""Readiness probe shared by the Kafka-protocol brokers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.metadata import MetadataRequest

from pipeline.embedded._process import port_open


@contextlib.contextmanager
def _aiokafka_quiet() -> Iterator[None]:
    """aiokafka logs every failed attempt at ERROR; while a broker boots those are expected."""
    logger = logging.getLogger("aiokafka")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)


async def kafka_ready(bootstrap: str, *, group_probe: str | None = "switchboard-readiness") -> bool:
    """True when a metadata call answers and (optionally) the group coordinator answers.

    The coordinator lookup matters on Apache Kafka: the first FindCoordinator creates
    ``__consumer_offsets``, and until that is done consumer groups fail with
    GroupCoordinatorNotAvailable; doing it here keeps that delay out of the first test.
    """
    host, _, port = bootstrap.split(",")[0].rpartition(":")  # a cluster's list: its first node
    if not port_open(host, int(port)):
        return False  # avoid aiokafka's noisy connection-refused logging while the broker boots
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    with _aiokafka_quiet():
        try:
            await asyncio.wait_for(admin.start(), 5)
            await asyncio.wait_for(admin.describe_cluster(), 5)
            if group_probe is not None:
                await asyncio.wait_for(admin.find_coordinator(group_probe), 5)
            return True
        finally:
            with contextlib.suppress(Exception):
                await admin.close()


async def brokers_listed_by_each_node(bootstrap: str) -> dict[int, int]:
    """Node id -> how many brokers that node's own metadata lists, for every node the bootstrap
    node knows of.

    Each broker keeps its own copy of the cluster's metadata and learns of a new broker a little
    after the controller does, so one node may list three brokers while another still lists two,
    and a topic created through the second gets two replicas. A plain metadata call asks a random
    node; this asks each one.
    """
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    with _aiokafka_quiet():
        try:
            await asyncio.wait_for(client.bootstrap(), 5)
            listed = {}
            for broker in client.cluster.brokers():
                response = await asyncio.wait_for(client.send(broker.nodeId, MetadataRequest([])), 5)
                listed[broker.nodeId] = len(response.to_object()["brokers"])
            return listed
        finally:
            with contextlib.suppress(Exception):
                await client.close()
