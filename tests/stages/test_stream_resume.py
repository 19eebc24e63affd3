"""A rebalance while Redis is away: the new owner resumes its streams once Redis is back, and the
rebalance itself never fails (a Redis error in Faust's rebalance callback stops the worker)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from pipeline import metrics
from pipeline.embedded import RedisServer
from pipeline.stages.streams import StreamRegistry
from pipeline.state import InflightStream, State
from tests.metric_values import current


class _Recorded(StreamRegistry):
    """The registry with its subscriptions recorded instead of opened (no session server here)."""

    def __init__(self, state: State) -> None:
        super().__init__(state.streams, cast(Any, None), cast(Any, None))
        self.started: list[tuple[int, str]] = []

    def _start(self, partition: int, stream: InflightStream) -> None:
        self.started.append((partition, stream.session_id))


@pytest.fixture
async def redis_and_state(
    redis_server_factory: Any, redis_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[RedisServer, State]]:
    """An AOF Redis of the test's own (killed and started again) and the stores on it."""
    server = await redis_server_factory(aof=True, data_dir=tmp_path / "data")
    state = State.connect(server.url, redis_prefix, mapping_ttl=600, dedup_ttl=300)
    try:
        yield server, state
    finally:
        await state.redis.aclose()


@pytest.mark.integration
async def test_streams_of_an_assignment_made_while_redis_is_down_resume_when_it_is_back(
    redis_and_state: tuple[RedisServer, State],
) -> None:
    server, state = redis_and_state
    await state.streams.add_inflight(1, InflightStream("s1", "k1"))
    await state.streams.add_inflight(2, InflightStream("s2", "k2"))
    await state.streams.add_inflight(3, InflightStream("s3", "k3"))  # not assigned to us
    registry = _Recorded(state)
    retries = metrics.HANDLER_RETRIES.labels("streams", "ConnectionError")
    before = current(retries)

    await server.kill()
    await registry.on_partitions_assigned({1, 2})  # returns at once: no Redis error raised here
    await asyncio.sleep(0.8)
    assert registry.started == []
    assert current(retries) > before  # it kept trying

    await server.start()
    await asyncio.wait_for(registry.resumed(), timeout=15)
    assert sorted(registry.started) == [(1, "s1"), (2, "s2")]
    await registry.close()


@pytest.mark.integration
async def test_a_newer_assignment_supersedes_a_resume_still_waiting_for_redis(
    redis_and_state: tuple[RedisServer, State],
) -> None:
    server, state = redis_and_state
    await state.streams.add_inflight(1, InflightStream("s1", "k1"))
    await state.streams.add_inflight(2, InflightStream("s2", "k2"))
    registry = _Recorded(state)
    await server.kill()
    await registry.on_partitions_assigned({1})
    await asyncio.sleep(0.3)
    await registry.on_partitions_assigned({2})  # partition 1 went elsewhere meanwhile
    await server.start()
    await asyncio.wait_for(registry.resumed(), timeout=15)
    await asyncio.sleep(0.3)
    assert registry.started == [(2, "s2")]
    await registry.close()
