"""CPU per session-API request: httpx's own pool vs the aiohttp transport the session client uses.

    .venv/bin/python bench/http_transport_bench.py [--requests 2000]

Client and simulator run in this one process, so the figure is their sum (the same server for both).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from collections.abc import Callable

import httpx

from pipeline.session.transport import session_transport
from pipeline.sim import SimServer


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(name: str, make: Callable[[], httpx.AsyncClient], url: str, requests: int) -> None:
    async with make() as client:
        for _ in range(50):  # warm the pool
            await client.get(url)
        slots = asyncio.Semaphore(16)

        async def one() -> None:
            async with slots:
                response = await client.get(url)
                response.raise_for_status()

        cpu, wall = _cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
    print(f"{name:<22} {requests / wall:8.0f} req/s   {cpu / requests * 1e6:7.0f} µs CPU per request")


async def main(requests: int) -> None:
    sim = SimServer()
    port = await sim.start()
    url = f"http://127.0.0.1:{port}/_sim/stats"
    try:
        await _measure("httpx (httpcore pool)", httpx.AsyncClient, url, requests)
        await _measure("httpx + aiohttp", lambda: httpx.AsyncClient(transport=session_transport(16)), url, requests)
    finally:
        await sim.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    asyncio.run(main(parser.parse_args().requests))
