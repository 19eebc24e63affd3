"""Readiness probe shared by the Kafka-protocol brokers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from aiokafka.admin import AIOKafkaAdminClient

from pipeline.embedded._process import port_open
from pipeline.kafka.admin import metadata_of_each_node


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

    A node learns of a new broker a little after the controller does, so one node may list three
    brokers while another still lists two, and a topic created through the second gets two replicas.
    """
    with _aiokafka_quiet():
        answers = await metadata_of_each_node(bootstrap, [])
    return {node: len(metadata["brokers"]) for node, metadata in answers.items()}
