"""The cost of `SWITCHBOARD_REDIS_REPLICA_WAIT_MS`: egress's `mark_delivered` with and without
`WAIT 1 <ms>` behind it, against a real primary with one replica and three sentinels on loopback,
through the `redis+sentinel://` URL.

    .venv/bin/python bench/replica_wait_bench.py [--calls 4000] [--concurrency 1,64]

Prints, per concurrency: calls/s, wall µs per call, and process CPU µs per call for each variant.
Loopback replication is the best case: across hosts each waited call costs at least one more
network round trip to the replica.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.embedded import SentinelTopology
from pipeline.state import DeliveryStore, Keys, RedisClient


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(url: str, wait_ms: int, calls: int, concurrency: int) -> tuple[float, float, float]:
    client = RedisClient(url, replica_wait_ms=wait_ms)
    store = DeliveryStore(client, Keys("bench:"), dedup_ttl=600)
    per_task = calls // concurrency

    async def worker(task: int) -> None:
        for i in range(per_task):
            await store.mark_delivered("bench", [f"out-{task}-{i}"])

    await asyncio.gather(*(worker(t) for t in range(concurrency)))  # warm up (connect, first writes)
    cpu0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(worker(t) for t in range(concurrency)))
    cpu, wall = _cpu() - cpu0, time.perf_counter() - t0
    await client.aclose()
    done = per_task * concurrency
    return done / wall, wall / done * 1e6 * concurrency, cpu / done * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--concurrency", default="1,64")
    args = parser.parse_args()
    topology = await SentinelTopology().start()
    try:
        url = topology.url()
        print("| concurrency | replica wait | calls/s | wall µs per call (per task) | CPU µs per call |")
        print("|---|---|---|---|---|")
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for wait_ms in (0, 100):
                rate, wall, cpu = await _measure(url, wait_ms, args.calls, concurrency)
                label = f"WAIT 1 {wait_ms}" if wait_ms else "off"
                print(f"| {concurrency} | {label} | {rate:,.0f} | {wall:,.0f} | {cpu:.1f} |")
    finally:
        await topology.stop()


if __name__ == "__main__":
    asyncio.run(main())
