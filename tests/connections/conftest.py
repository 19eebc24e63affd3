"""Long-connection tests: the stores over a real Redis (a blocking client of its own, as workers
have), a fake producer that records what would reach `im.inbound`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline.state import ConnectionStore, Keys, RedisClient


@pytest.fixture
async def blocking_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def quick_client(redis_url: str) -> AsyncIterator[RedisClient]:
    """The stores' own client (no blocking commands)."""
    client = RedisClient(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def store(quick_client: RedisClient, blocking_client: aioredis.Redis, redis_prefix: str) -> ConnectionStore:
    return ConnectionStore(quick_client, blocking_client, Keys(redis_prefix), done_ttl=600)


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
