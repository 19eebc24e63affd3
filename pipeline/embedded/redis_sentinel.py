"""A real Redis Sentinel deployment on loopback: a primary, a replica and three sentinels (quorum 2),
each a redis-server process.

Fault tests and the chaos bench SIGKILL the current primary (`kill_primary`), wait until the sentinels
have promoted the replica (`wait_promoted`) and bring the killed server back as the new primary's
replica (`rejoin`), the way a supervised node restarts; `restart_as_primary` shows why it must.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pipeline.embedded._process import ProcessGroup
from pipeline.embedded.exceptions import ServiceStartError
from pipeline.embedded.redis import RedisSentinel, RedisServer

MASTER = "switchboard"


class SentinelTopology(ProcessGroup):
    """Two servers (`primary` and `replica` name their roles at the start; a failover swaps them) and
    three sentinels that monitor them as `master_name`, optionally with passwords and AOF."""

    def __init__(
        self,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        aof: bool = False,
        master_name: str = MASTER,
        down_after_ms: int = 2000,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
    ) -> None:
        self.password = password
        # A primary silent this long is down. 1 s was too short on a loaded 2-core machine: a just
        # promoted primary with `appendfsync always`, doing a replica's full sync, went unanswered
        # for about 1 s, and all three sentinels failed it over again.
        self.down_after_ms = down_after_ms
        self.sentinel_password = sentinel_password
        self.master_name = master_name
        self._run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="sb-rsentinel-"))
        if keep_run_dir is None:
            keep_run_dir = os.environ.get("SWITCHBOARD_KEEP_RUN_DIRS", "") not in ("", "0")
        # Removed by `stop` when we made it (the members' dirs are inside it).
        self._remove_run_dir = run_dir is None and not keep_run_dir
        self._keep_run_dir = keep_run_dir
        self.primary = RedisServer(
            password=password, aof=aof, run_dir=self._run_dir / "redis-a", keep_run_dir=keep_run_dir
        )
        self.replica = RedisServer(
            password=password, aof=aof, run_dir=self._run_dir / "redis-b", keep_run_dir=keep_run_dir
        )
        self.sentinels: list[RedisSentinel] = []

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, self.replica]

    def url(self, db: int = 0) -> str:
        """`redis+sentinel://[:password@]host:port,…/<master>/<db>[?sentinel_password=…]`."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        members = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        option = f"?sentinel_password={quote(self.sentinel_password, safe='')}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{members}/{self.master_name}/{db}{option}"

    async def start(self) -> SentinelTopology:
        """Primary, replica and three sentinels (down after `down_after_ms`, failover timeout 5 s), settled."""
        try:
            await self.primary.start()
            self.replica.extra_args = ["--replicaof", self.primary.host, str(self.primary.port)]
            await self.replica.start()
            for i in range(3):
                sentinel = RedisSentinel(
                    self.master_name,
                    (self.primary.host, self.primary.port),
                    down_after_ms=self.down_after_ms,
                    auth_pass=self.password,
                    requirepass=self.sentinel_password,
                    run_dir=self._run_dir / f"sentinel{i}",
                    keep_run_dir=self._keep_run_dir,
                )
                self.sentinels.append(sentinel)
                await sentinel.start()
            await self.wait_until_ready()
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        """A plain coroutine (not a generator), so it can be started in one event loop and stopped in
        another."""
        for member in [*reversed(self.sentinels), *self.servers]:
            await member.stop()
        if self._remove_run_dir and not any(m.is_running for m in [*self.sentinels, *self.servers]):
            shutil.rmtree(self._run_dir, ignore_errors=True)

    # -- faults --------------------------------------------------------------------------------------
    async def current_primary(self) -> RedisServer:
        """The server the sentinels name as primary now."""
        address = await self.primary_address()
        for server in self.servers:
            if (server.host, server.port) == address:
                return server
        raise ServiceStartError(f"the sentinels name {address}, which is none of this topology's servers")

    async def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary (a crash: nothing flushed, no goodbye); the killed server."""
        victim = await self.current_primary()
        await victim.kill()
        return victim

    async def wait_promoted(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Wait until every sentinel names another server than `old` as primary and that server says
        it is one (ROLE); that server."""
        deadline = time.monotonic() + timeout
        seen: set[tuple[str, int] | None] = set()
        while time.monotonic() < deadline:
            seen = {await self._reported_primary(s) for s in self.sentinels}
            if len(seen) == 1 and (address := seen.pop()) is not None and address != (old.host, old.port):
                promoted = next((s for s in self.servers if (s.host, s.port) == address), None)
                if promoted is not None and promoted.is_running and await self._role(promoted) == "master":
                    return promoted
            await asyncio.sleep(0.1)
        raise ServiceStartError(
            f"the sentinels did not promote a replica of port {old.port} within {timeout:.0f} s (they name {seen})"
        )

    async def rejoin(self, server: RedisServer, timeout: float = 60.0) -> None:
        """Start a killed server again on its port with its data, the way a supervised node restarts
        (the compose file's start script, the Bitnami chart): as the replica of the primary the
        sentinels name. Return once the sentinels list it as a healthy replica, in sync, so a later
        failover has one to promote."""
        _drop_replicaof(server)
        host, port = await self.primary_address()
        if (host, port) != (server.host, server.port):
            server.extra_args += ["--replicaof", host, str(port)]
        await server.restart()
        await self.wait_until_ready(timeout)

    async def restart_as_primary(self, server: RedisServer) -> None:
        """Start a killed server again as the primary it was, without asking the sentinels, and return
        at once: until the sentinels demote it (about 8 s later) it serves its old data, and a
        failover in that window promotes it (`tests/state/test_sentinel.py` shows the writes lost)."""
        _drop_replicaof(server)
        await server.restart()

    async def force_failover(self, timeout: float = 20.0) -> None:
        """`SENTINEL FAILOVER` on the first sentinel, asked again while it has no replica it would
        promote yet (it learns a restarted server's state from its next INFO)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self._sentinel_command(self.sentinels[0], "SENTINEL", "FAILOVER", self.master_name)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    # -- probes --------------------------------------------------------------------------------------
    async def primary_address(self) -> tuple[str, int]:
        """The primary most of the answering sentinels name (one that has not caught up with a
        failover yet is outvoted)."""
        reported = Counter(r for r in [await self._reported_primary(s) for s in self.sentinels] if r is not None)
        if not reported:
            raise ServiceStartError(f"no sentinel of {self.master_name} answered")
        return reported.most_common(1)[0][0]

    async def wait_until_ready(self, timeout: float = 30.0) -> None:
        """Every sentinel agrees on the primary, knows the two other sentinels and every other live
        server as a healthy replica, which is in sync with that primary (a failover needs a quorum
        to agree and a replica to promote)."""
        deadline = time.monotonic() + timeout
        problem = "not asked yet"
        while time.monotonic() < deadline:
            try:
                problem = await self._not_ready()
            except Exception as exc:  # a member not answering yet
                problem = repr(exc)
            if not problem:
                return
            await asyncio.sleep(0.1)
        raise ServiceStartError(f"the Sentinel topology did not settle within {timeout:.0f} s: {problem}")

    async def _not_ready(self) -> str:
        """What is not ready yet ('' when all is)."""
        reported = {await self._reported_primary(s) for s in self.sentinels}
        if len(reported) != 1 or None in reported:
            return f"the sentinels name {reported} as primary"
        address = next(iter(reported))
        assert address is not None
        replicas = [s for s in self.servers if s.is_running and (s.host, s.port) != address]
        for server in replicas:
            info = await self._server_command(server, "INFO", "replication")
            if not isinstance(info, dict):  # redis-py parses INFO into a dict; else the raw text
                info = dict(line.split(":", 1) for line in str(info).splitlines() if ":" in line)
            fields = {k: str(v) for k, v in info.items()}
            if fields.get("role") != "slave" or (fields.get("master_host"), fields.get("master_port")) != (
                address[0],
                str(address[1]),
            ):
                return f"port {server.port} is not a replica of {address} yet"
            if fields.get("master_link_status") != "up":
                return f"port {server.port} not in sync yet"
        for sentinel in self.sentinels:
            master = _fields(await self._sentinel_command(sentinel, "SENTINEL", "MASTER", self.master_name))
            if int(master.get("num-other-sentinels", 0)) < len(self.sentinels) - 1:
                return f"sentinel {sentinel.port} knows {master.get('num-other-sentinels')} other sentinels"
            known = await self._sentinel_command(sentinel, "SENTINEL", "SLAVES", self.master_name)
            healthy = {
                (f["ip"], int(f["port"])) for f in map(_fields, known) if set(str(f["flags"]).split(",")) == {"slave"}
            }
            for server in replicas:
                if (server.host, server.port) not in healthy:
                    return f"sentinel {sentinel.port} does not list port {server.port} as a healthy replica"
        return ""

    async def _role(self, server: RedisServer) -> str | None:
        try:
            role = await self._server_command(server, "ROLE")
        except Exception:
            return None
        return str(role[0]) if isinstance(role, list) and role else None

    async def _reported_primary(self, sentinel: RedisSentinel) -> tuple[str, int] | None:
        try:
            host, port = await self._sentinel_command(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        except Exception:
            return None
        return str(host), int(port)

    async def _server_command(self, server: RedisServer, *args: str) -> Any:
        return await _command(server.host, server.port, self.password, *args)

    async def _sentinel_command(self, sentinel: RedisSentinel, *args: str) -> Any:
        return await _command(sentinel.host, sentinel.port, self.sentinel_password, *args)


async def _command(host: str, port: int, password: str | None, *args: str) -> Any:
    """One command on a short-lived connection (redis-py parses some replies, INFO into a dict)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    client = aioredis.Redis(
        host=host,
        port=port,
        password=password,
        decode_responses=True,
        socket_connect_timeout=2,
        socket_timeout=3,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return await client.execute_command(*args)
    finally:
        await client.aclose()


def _drop_replicaof(server: RedisServer) -> None:
    """Forget the role of a previous start (`--replicaof HOST PORT`)."""
    if "--replicaof" in server.extra_args:
        at = server.extra_args.index("--replicaof")
        del server.extra_args[at : at + 3]


def _fields(reply: Any) -> dict[str, Any]:
    """A flat `[name, value, …]` reply (or one redis-py already made a dict) as a dict."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))
