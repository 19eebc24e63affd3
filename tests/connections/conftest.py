"""Long-connection tests: the stores over a real Redis (a blocking client of its own, as workers
have), a fake producer that records what would reach `im.inbound`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipeline.state import ConnectionStore, Keys, RedisClient, RedisPy, redis_py_client


@pytest.fixture(params=["redis", "cluster"])
def store_url(request: pytest.FixtureRequest) -> str:
    """The store's Redis: one server (a fresh DB), or the session's Redis Cluster."""
    if request.param == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
async def blocking_client(store_url: str) -> AsyncIterator[RedisPy]:
    client = redis_py_client(store_url, decode_responses=True, socket_timeout=30)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def quick_client(store_url: str) -> AsyncIterator[RedisClient]:
    """The stores' own client (no blocking commands)."""
    client = RedisClient(store_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def store(quick_client: RedisClient, blocking_client: RedisPy, redis_prefix: str) -> ConnectionStore:
    return ConnectionStore(
        quick_client, blocking_client, Keys(redis_prefix, cluster=quick_client.cluster), done_ttl=600
    )


@dataclass
class Produced:
    """A stand-in for the worker's producer: records each send; the broker's acknowledgement is a
    future the test may hold back or fail."""

    records: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    hold: bool = False
    acks: list[asyncio.Future[None]] = field(default_factory=list)

    async def send(self, topic: str, key: str | None, value: bytes) -> Any:
        self.records.append((topic, key, value))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.hold:
            ack.set_result(None)
        self.acks.append(ack)
        return ack


@pytest.fixture
def produced() -> Produced:
    return Produced()
