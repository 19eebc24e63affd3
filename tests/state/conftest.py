from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pipeline.state import State


@pytest.fixture
async def state(redis_url: str, redis_prefix: str) -> AsyncIterator[State]:
    state = State.connect(redis_url, redis_prefix, mapping_ttl=600, dedup_ttl=300)
    yield state
    await state.redis.aclose()
