"""Readiness probe shared by the Kafka-protocol brokers."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient

from pipeline.embedded._process import port_open


async def kafka_ready(bootstrap: str, *, group_probe: str | None = "switchboard-readiness", brokers: int = 1) -> bool:
    """True when a metadata call lists `brokers` brokers and (optionally) the group coordinator
    answers.

    The coordinator lookup matters on Apache Kafka: the first FindCoordinator creates
    ``__consumer_offsets``, and until that is done consumer groups fail with
    GroupCoordinatorNotAvailable; doing it here keeps that delay out of the first test.
    """
    host, _, port = bootstrap.split(",")[0].rpartition(":")  # a cluster's list: its first node
    if not port_open(host, int(port)):
        return False  # avoid aiokafka's noisy connection-refused logging while the broker boots
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    # aiokafka logs every failed attempt at ERROR; while booting those are expected.
    logger = logging.getLogger("aiokafka")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        await asyncio.wait_for(admin.start(), 5)
        cluster = await asyncio.wait_for(admin.describe_cluster(), 5)
        if len(cluster.get("brokers") or []) < brokers:
            return False
        if group_probe is not None:
            await asyncio.wait_for(admin.find_coordinator(group_probe), 5)
        return True
    finally:
        logger.setLevel(old)
        with contextlib.suppress(Exception):
            await admin.close()
