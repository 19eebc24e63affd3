"""A worker answers health checks, metrics and webhooks while its consumer group is still joining.

A join completes only when every member of the group has revoked its partitions and rejoined; a
member busy finishing its fetched records (or a SIGKILLed one, until its session times out) holds
everyone's join. Faust starts an app's services only after the first rebalance, so a worker used to
serve nothing all that while, and a supervisor's probe would give up on it. Here a member of the
worker's group blocks in its revocation; the new worker must be up (its own /healthz) while the
rebalance is still held (its /readyz saying it does not consume yet), and take its partitions once
the member lets go.

Apache Kafka only: Tansu (0.6) completes a rebalance without the member still in its revocation,
so nothing holds the join there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from pipeline.bench.measure import metric_sum, scrape_metrics
from pipeline.embedded.exceptions import ServiceStartError
from pipeline.stack import Stack
from pipeline.topics import IM_INBOUND
from tests.conftest import enabled_brokers

from .stacks import running_stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("kafka" not in enabled_brokers(), reason="needs Apache Kafka (SWITCHBOARD_TEST_BROKERS=kafka)"),
]


class _HeldRevocation(ConsumerRebalanceListener):
    """Blocks in the revocation of a rebalance once `hold` is set, until `release` is."""

    def __init__(self) -> None:
        self.hold = False
        self.revoking = asyncio.Event()
        self.release = asyncio.Event()
        self.assigned = asyncio.Event()

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        if self.hold:
            self.revoking.set()
            await self.release.wait()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if assigned:
            self.assigned.set()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack("kafka", name="join") as stack:
        yield stack


async def _assigned(url: str) -> float:
    return metric_sum(await scrape_metrics(url), "switchboard_partitions_assigned")


async def test_a_worker_serves_while_a_member_holds_the_groups_rebalance(stack: Stack) -> None:
    settings = stack.settings()
    listener = _HeldRevocation()
    member = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.app_id,
        partition_assignment_strategy=[RangePartitionAssignor],  # the workers' assignor
        session_timeout_ms=30_000,
        heartbeat_interval_ms=1_000,
        rebalance_timeout_ms=120_000,
        max_poll_interval_ms=300_000,
    )
    await member.start()
    member.subscribe([IM_INBOUND], listener=listener)

    async def poll() -> None:
        while True:
            await member.getmany(timeout_ms=200)

    polling = asyncio.create_task(poll())
    try:
        await asyncio.wait_for(listener.assigned.wait(), 60)  # the member is in the group with its share
        listener.hold = True
        try:
            joining = await stack.add_worker()
        except ServiceStartError as exc:
            pytest.fail(f"the worker served nothing while its group was joining: {exc}")
        # Its join reaches the group, and the member holds the rebalance in its revocation.
        await asyncio.wait_for(listener.revoking.wait(), 60)
        await asyncio.sleep(2 * settings.kafka_session_timeout_seconds)  # long past a heartbeat
        assert not listener.release.is_set()
        assert await _assigned(joining.url) == 0  # still joining…
        async with httpx.AsyncClient() as http:  # …and serving, while saying it does not consume yet
            assert (await http.get(joining.url + "/healthz")).json()["instance"] == joining.instance_id
            readyz = await http.get(joining.url + "/readyz")
            assert readyz.status_code == 503 and readyz.json()["checks"]["consuming"] is False, readyz.text

        listener.release.set()
        deadline = asyncio.get_running_loop().time() + 90
        while await _assigned(joining.url) == 0:  # once the member lets go, the join completes
            assert asyncio.get_running_loop().time() < deadline, "the worker never got partitions"
            await asyncio.sleep(0.5)
        await joining.wait_consuming(timeout=60)  # and /readyz says ready
    finally:
        listener.release.set()
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        await member.stop()
