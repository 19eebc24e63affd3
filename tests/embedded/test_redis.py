"""RedisServer lifecycle, persistence options and the redis fixtures' isolation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import redis.asyncio as aioredis

from pipeline.embedded import RedisServer, port_open


async def _get(url: str, key: str) -> bytes | None:
    client = aioredis.Redis.from_url(url)
    try:
        return cast(bytes | None, await client.get(key))  # the client does not decode responses
    finally:
        await client.aclose()


async def _set(url: str, key: str, value: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.set(key, value)
    finally:
        await client.aclose()


async def test_start_stop_async(tmp_path: Path) -> None:
    server = RedisServer(run_dir=tmp_path)
    async with server:
        assert server.url.startswith("redis://127.0.0.1:")
        assert await server.health()
        await _set(server.url, "k", "v")
        assert await _get(server.url, "k") == b"v"
    assert not server.is_running
    assert not port_open("127.0.0.1", server.port)


def test_sync_context_manager() -> None:
    with RedisServer() as server:
        assert port_open("127.0.0.1", server.port)
    assert not server.is_running


async def test_restart_without_persistence_loses_data(
    redis_server_factory: Callable[..., Awaitable[RedisServer]],
) -> None:
    server = await redis_server_factory()
    await _set(server.url, "k", "v")
    port = server.port
    await server.restart()
    assert server.port == port
    assert await _get(server.url, "k") is None


async def test_aof_survives_restart_and_kill(
    redis_server_factory: Callable[..., Awaitable[RedisServer]], tmp_path: Path
) -> None:
    server = await redis_server_factory(aof=True, data_dir=tmp_path / "data")
    await _set(server.url, "k", "v1")
    await server.restart()
    assert await _get(server.url, "k") == b"v1"
    await _set(server.url, "k", "v2")
    await server.kill()  # SIGKILL: appendfsync always keeps the acknowledged write
    assert not await server.health()
    await server.start()
    assert await _get(server.url, "k") == b"v2"
    assert (tmp_path / "data").exists()


async def test_redis_url_is_isolated_per_test(
    redis_url: str, redis_client: aioredis.Redis, redis_server: RedisServer
) -> None:
    assert redis_url.startswith(f"redis://127.0.0.1:{redis_server.port}/")
    assert await redis_client.dbsize() == 0
    await redis_client.set("shared-name", "mine")


async def test_redis_url_is_isolated_per_test_again(redis_url: str, redis_client: aioredis.Redis) -> None:
    # Same key as the test above: a fresh DB does not see it.
    assert await redis_client.get("shared-name") is None


def test_redis_prefix_unique(redis_prefix: str, unique_name: Callable[..., str]) -> None:
    assert redis_prefix.endswith(":")
    assert unique_name("x") != unique_name("x")
