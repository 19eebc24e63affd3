from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pipeline.state import State


@pytest.fixture(params=["redis", "cluster"])
def state_url(request: pytest.FixtureRequest) -> str:
    """The stores' Redis: one server (a fresh DB), or the session's Redis Cluster (keys apart by
    the test's prefix)."""
    if request.param == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
async def state(state_url: str, redis_prefix: str) -> AsyncIterator[State]:
    state = State.connect(state_url, redis_prefix, mapping_ttl=600, dedup_ttl=300)
    yield state
    await state.redis.aclose()
