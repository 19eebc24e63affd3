"""Fixtures: a real simulator on a free port, and clients of both profiles."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pipeline.session import RetryPolicy, SessionClient
from pipeline.sim import SimServer, SimSettings

API_KEY = "test-key"


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = SimServer(SimSettings(api_key=API_KEY, ping_interval=0.5, seed=7))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def make_client(sim: SimServer, profile: str = "ark", **options: object) -> SessionClient:
    options.setdefault("retry", RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05))
    return SessionClient(api_key=API_KEY, profile=profile, base_url=sim.base_url(profile), **options)  # type: ignore[arg-type]


@pytest.fixture
async def ark(sim: SimServer) -> AsyncIterator[SessionClient]:
    async with make_client(sim, "ark") as client:
        yield client


@pytest.fixture
async def anthropic_client(sim: SimServer) -> AsyncIterator[SessionClient]:
    async with make_client(sim, "anthropic") as client:
        yield client
