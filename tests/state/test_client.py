"""The stores' Redis client against a real redis-server: pipelining, transactions, scripts, errors,
lost connections and overdue replies."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pipeline.embedded import RedisServer
from pipeline.state.client import Endpoint, RedisClient, Script


async def test_concurrent_calls_share_writes_and_each_gets_its_own_reply(redis_url: str) -> None:
    client = RedisClient(redis_url)
    try:
        replies = await asyncio.gather(*(client.execute("INCRBY", f"k{n % 7}", n) for n in range(700)))
        totals = {f"k{m}": sum(n for n in range(700) if n % 7 == m) for m in range(7)}
        assert await client.execute("MGET", *totals) == [str(v) for v in totals.values()]
        assert len(replies) == 700 and all(isinstance(r, int) for r in replies)
    finally:
        await client.aclose()


async def test_pipelines_transactions_and_the_urls_database(redis_url: str, redis_client: aioredis.Redis) -> None:
    client = RedisClient(redis_url)
    try:
        assert await client.pipeline([("SET", "a", "1"), ("INCR", "a"), ("GET", "a")]) == ["OK", 2, "2"]
        assert await client.transaction([("LPUSH", "l", "x", "y"), ("LLEN", "l"), ("LRANGE", "l", 0, -1)]) == [
            2,
            2,
            ["y", "x"],
        ]
        assert await client.pipeline([]) == []
        assert await redis_client.get("a") == b"2"  # the same database as redis-py's client of the URL
    finally:
        await client.aclose()


async def test_error_replies_are_redis_pys_errors_and_leave_the_connection_usable(redis_url: str) -> None:
    client = RedisClient(redis_url)
    try:
        await client.execute("SET", "s", "text")
        with pytest.raises(ResponseError, match="not an integer"):
            await client.execute("INCR", "s")
        with pytest.raises(ResponseError):
            await client.transaction([("INCR", "s")])
        with pytest.raises(ResponseError):
            await client.pipeline([("GET", "s"), ("INCR", "s"), ("GET", "s")])
        assert await client.execute("GET", "s") == "text"
    finally:
        await client.aclose()


async def test_a_script_redis_lost_is_loaded_again(redis_url: str) -> None:
    client = RedisClient(redis_url)
    script = Script("return {KEYS[1], ARGV[1]}")
    try:
        assert await client.run_script(script, ["key"], ["arg"]) == ["key", "arg"]
        await client.execute("SCRIPT", "FLUSH")  # as after a restart without AOF
        assert await client.run_script(script, ["key2"], [3]) == ["key2", "3"]
    finally:
        await client.aclose()


async def test_round_trips_are_counted_once_per_call(redis_url: str) -> None:
    client = RedisClient(redis_url)
    count = lambda: REGISTRY.get_sample_value("switchboard_redis_round_trips_total") or 0.0  # noqa: E731
    try:
        await client.execute("PING")
        before = count()
        await client.execute("PING")
        await client.pipeline([("PING",), ("PING",)])
        await client.transaction([("PING",)])
        assert count() - before == 3
    finally:
        await client.aclose()


async def test_a_lost_connection_fails_the_calls_waiting_and_the_next_call_reconnects(
    redis_server_factory: object,
) -> None:
    server: RedisServer = await redis_server_factory()  # type: ignore[operator]
    client = RedisClient(server.url)
    try:
        assert await client.execute("SET", "before", "1") == "OK"
        await server.stop()
        with pytest.raises(RedisConnectionError):
            await client.execute("GET", "before")
        await server.start()
        assert await client.execute("PING") == "PONG"
    finally:
        await client.aclose()


async def test_an_overdue_reply_times_out_and_the_client_recovers(redis_url: str, redis_client: aioredis.Redis) -> None:
    client = RedisClient(redis_url, socket_timeout=0.6)
    try:
        await client.execute("PING")
        await redis_client.execute_command("CLIENT", "PAUSE", 2500, "ALL")  # Redis stops answering
        with pytest.raises(RedisTimeoutError):
            await client.execute("GET", "x")
        await asyncio.sleep(2.6)
        assert await client.execute("PING") == "PONG"
    finally:
        await client.aclose()


def test_urls() -> None:
    assert Endpoint.from_url("redis://127.0.0.1:6380/3") == Endpoint("127.0.0.1", 6380, 3)
    tls = Endpoint.from_url("rediss://user:p%40ss@cache.example:6379")
    assert (tls.username, tls.password, tls.tls, tls.db) == ("user", "p@ss", True, 0)
    with pytest.raises(ValueError, match="redis://"):
        Endpoint.from_url("http://example")
