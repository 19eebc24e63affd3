from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from pipeline.state import State


@pytest.fixture
def state(redis_url: str, redis_prefix: str) -> State:
    return State.open(aioredis.from_url(redis_url, decode_responses=True), redis_prefix, mapping_ttl=600, dedup_ttl=300)
