"""CPU per Redis round trip with the pool settings the worker could use.

    .venv/bin/python bench/redis_client_bench.py [--url redis://…]   # starts an embedded redis without --url

Concurrent GETs (64 tasks, like many conversations in flight) through redis-py's asyncio client;
prints process CPU per call for each variant. Ratios within one run are what matter.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis

from pipeline.state.client import RedisClient, Script


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# A script call the size of dispatch's `begin_turn`: eight keys, a turn record and a held command.
_SCRIPT = "return 1"
_KEYS = [f"bench:conv:console:demo:chat-{i}" for i in range(8)]
_ARGS: list[str | int] = [
    "sevt-sb-0123456789abcdef01234567",
    "x" * 3000,
    "merge",
    "y" * 400,
    '{"conversation_key": "k"}',
    604800,
    86400,
]


async def _measure(pool: Any, calls: int, concurrency: int, *, script: bool = False) -> tuple[float, float]:
    redis = Redis(connection_pool=pool)
    await redis.set("bench:k", "v")
    call = redis.register_script(_SCRIPT)
    per_task = calls // concurrency

    async def worker() -> None:
        for _ in range(per_task):
            if script:
                await call(keys=_KEYS, args=_ARGS)
            else:
                await redis.get("bench:k")

    await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm the pool
    cpu0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = _cpu() - cpu0, time.perf_counter() - t0
    await redis.aclose()
    return cpu / (per_task * concurrency) * 1e6, per_task * concurrency / wall


async def _measure_stores_client(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    client = RedisClient(url)
    script = Script(_SCRIPT)
    per_task = calls // concurrency

    async def worker() -> None:
        for _ in range(per_task):
            await client.run_script(script, _KEYS, _ARGS)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = _cpu() - cpu0, time.perf_counter() - t0
    await client.aclose()
    return cpu / (per_task * concurrency) * 1e6, per_task * concurrency / wall


async def main(url: str, calls: int, concurrency: int) -> None:
    variants = {
        "blocking pool, socket_timeout=10, health check 15 s (before)": lambda: BlockingConnectionPool.from_url(
            url, max_connections=256, timeout=20, socket_timeout=10, health_check_interval=15, decode_responses=True
        ),
        "plain pool, socket_timeout=10, health check 15 s": lambda: ConnectionPool.from_url(
            url, max_connections=1024, socket_timeout=10, health_check_interval=15, decode_responses=True
        ),
        "plain pool, no socket timeout, no health check": lambda: ConnectionPool.from_url(
            url, max_connections=1024, decode_responses=True
        ),
    }
    for name, make in variants.items():
        us, rate = await _measure(make(), calls, concurrency)
        print(f"{us:7.1f} µs CPU/call  {rate:8.0f} calls/s  {name}")
    pool = ConnectionPool.from_url(url, max_connections=1024, socket_timeout=10, decode_responses=True)
    us, rate = await _measure(pool, calls, concurrency, script=True)
    print(f"{us:7.1f} µs CPU/call  {rate:8.0f} calls/s  script call of a turn's size, redis-py's client (before)")
    us, rate = await _measure_stores_client(url, calls, concurrency)
    print(f"{us:7.1f} µs CPU/call  {rate:8.0f} calls/s  script call of a turn's size, the stores' client (pipelining)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--calls", type=int, default=40_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.calls, args.concurrency))
    else:
        from pipeline.embedded.redis import RedisServer

        with RedisServer() as server:
            asyncio.run(main(server.url, args.calls, args.concurrency))
