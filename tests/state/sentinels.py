"""A real Sentinel topology for tests: a primary, a replica and three sentinels, each a redis-server
process on a free port (stopped at the end, killed at exit if a test dies first)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis

from pipeline.embedded import RedisSentinel, RedisServer

MASTER = "switchboard"


@dataclass
class SentinelTopology:
    primary: RedisServer
    replica: RedisServer
    sentinels: list[RedisSentinel]
    password: str | None = None
    sentinel_password: str | None = None

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        members = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        option = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{members}/{MASTER}/{db}{option}"

    async def stop(self) -> None:
        for server in [*reversed(self.sentinels), self.replica, self.primary]:
            await server.stop()

    async def primary_address(self) -> tuple[str, int]:
        """The primary as the first sentinel that answers reports it."""
        for sentinel in self.sentinels:
            reported = await _reported_primary(sentinel)
            if reported is not None:
                return reported
        raise AssertionError("no sentinel answered")

    async def wait_until_promoted(self, server: RedisServer, timeout: float = 30.0) -> float:
        """Seconds until every sentinel reports `server` as the primary."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            reported = {await _reported_primary(sentinel) for sentinel in self.sentinels}
            if reported == {(server.host, server.port)}:
                return time.monotonic() - t0
            await asyncio.sleep(0.1)
        raise AssertionError(f"the sentinels did not promote port {server.port} within {timeout} s")

    async def wait_until_ready(self, timeout: float = 20.0) -> None:
        """The replica in sync and every sentinel knowing the replica and the two other sentinels
        (a failover needs them: a quorum to agree and a replica to promote)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self._ready():
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the sentinel topology did not settle")

    async def _ready(self) -> bool:
        replica = aioredis.Redis(
            host=self.replica.host, port=self.replica.port, password=self.password, decode_responses=True
        )
        try:
            info = await replica.info("replication")
            if info.get("master_link_status") != "up":
                return False
        finally:
            await replica.aclose()
        for sentinel in self.sentinels:
            client = aioredis.Redis(
                host=sentinel.host, port=sentinel.port, password=sentinel.password, decode_responses=True
            )
            try:
                master = await client.execute_command("SENTINEL", "master", MASTER)
                fields = dict(zip(master[::2], master[1::2], strict=True)) if isinstance(master, list) else master
                if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
                    return False
            finally:
                await client.aclose()
        return True


async def _reported_primary(sentinel: RedisSentinel) -> tuple[str, int] | None:
    client = aioredis.Redis(host=sentinel.host, port=sentinel.port, password=sentinel.password, decode_responses=True)
    try:
        host, port = await client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
        return str(host), int(port)
    except Exception:
        return None
    finally:
        await client.aclose()


async def start_topology(*, password: str | None = None, sentinel_password: str | None = None) -> SentinelTopology:
    """Primary, replica and three sentinels (quorum 2, down after 1 s, failover timeout 5 s), settled;
    `SentinelTopology.stop()` stops them (a plain coroutine, not a generator, so it can be started
    in one event loop and stopped in another)."""
    primary = RedisServer(password=password)
    topology = SentinelTopology(primary, RedisServer(password=password), [], password, sentinel_password)
    try:
        await primary.start()
        topology.replica.extra_args = ["--replicaof", primary.host, str(primary.port)]
        await topology.replica.start()
        for _ in range(3):
            sentinel = RedisSentinel(
                MASTER, (primary.host, primary.port), auth_pass=password, requirepass=sentinel_password
            )
            topology.sentinels.append(sentinel)
            await sentinel.start()
        await topology.wait_until_ready()
    except BaseException:
        await topology.stop()
        raise
    return topology


@contextlib.asynccontextmanager
async def sentinel_topology(
    *, password: str | None = None, sentinel_password: str | None = None
) -> AsyncIterator[SentinelTopology]:
    topology = await start_topology(password=password, sentinel_password=sentinel_password)
    try:
        yield topology
    finally:
        await topology.stop()
