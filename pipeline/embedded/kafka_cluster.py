"""A replicated Apache Kafka cluster on one machine: N KRaft nodes, each broker and controller.

Every node is an :class:`ApacheKafka` with its own ports, log directory and JVM, all formatted with
one cluster id and voting in one controller quorum of N (a majority must be up for anything to
work, so a 3-node cluster survives one node down). Internal topics get N replicas and
``min.insync.replicas`` N-1, and so does a topic created without explicit settings.

For fault tests and the chaos bench: :meth:`KafkaCluster.kill` (SIGKILL one node),
:meth:`KafkaCluster.start_node` (bring it back on the same ports with its data),
:meth:`KafkaCluster.busiest_leader` (the node leading most partitions of some topics),
:meth:`KafkaCluster.wait_in_sync` (every replica back in the ISR) and
:meth:`KafkaCluster.rolling_restart`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from pipeline.embedded._kafka_probe import brokers_listed_by_each_node
from pipeline.embedded._process import free_ports
from pipeline.embedded.apache_kafka import DEFAULT_KAFKA_VERSION, ApacheKafka, random_cluster_id
from pipeline.embedded.exceptions import ServiceStartError
from pipeline.kafka.admin import admin_client

# Seconds the started nodes get to all register with the controller.
_ALL_BROKERS_TIMEOUT = 60.0


@dataclass(frozen=True)
class PartitionReplicas:
    """Who leads one partition and which replicas are in sync (node ids; leader -1: none)."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class KafkaCluster:
    """``nodes`` Apache Kafka nodes (KRaft combined mode) on 127.0.0.1, node ids 1..nodes.

    ``await cluster.start()`` / ``await cluster.stop()``, or ``async with KafkaCluster() as c``.
    Each JVM gets ``heap`` (the nodes share the machine with the workers under test).
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        version: str = DEFAULT_KAFKA_VERSION,
        host: str = "127.0.0.1",
        heap: str = "512m",
        extra_properties: dict[str, str] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self._owns_run_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="switchboard-kafkas-"))
        self.cluster_id = random_cluster_id()
        chosen = iter(free_ports(2 * nodes, host))  # all distinct
        ports = {i: (next(chosen), next(chosen)) for i in range(1, nodes + 1)}
        voters = ",".join(f"{i}@{host}:{controller}" for i, (_, controller) in ports.items())
        self.nodes: dict[int, ApacheKafka] = {}
        for i, (port, controller) in ports.items():
            node = ApacheKafka(
                version=version,
                port=port,
                controller_port=controller,
                host=host,
                heap=heap,
                extra_properties=extra_properties,
                run_dir=self.run_dir / f"node{i}",
                keep_run_dir=keep_run_dir,
                node_id=i,
                cluster_id=self.cluster_id,
                quorum_voters=voters,
                replicas=nodes,
            )
            node.name = f"kafka{i}"  # log file and messages name the node
            self.nodes[i] = node

    # -- what clients see ----------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """Every node, so a client can bootstrap while any one is down."""
        return ",".join(n.bootstrap for n in self.nodes.values())

    @property
    def live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values() if n.is_running)

    def node(self, node_id: int) -> ApacheKafka:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ValueError(f"no node {node_id}; nodes are {sorted(self.nodes)}") from None

    def pids(self) -> dict[str, int | None]:
        return {node.name: node.pid for node in self.nodes.values()}

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> Self:
        """Start every node and wait until all are ready. A node cannot become ready alone: its
        broker waits for a controller quorum, so the nodes are started together."""
        results = await asyncio.gather(*(n.start() for n in self.nodes.values()), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise ServiceStartError(f"Kafka cluster did not start: {errors[0]}") from errors[0]
        # Each node answers clients before every node's metadata lists every broker: until then a
        # topic asking for 3 replicas may be created with fewer (seen on a slow machine, also when
        # one node already listed all three).
        deadline = time.monotonic() + _ALL_BROKERS_TIMEOUT
        listed: dict[int, int] = {}
        while not self._all_brokers_listed(listed):
            if time.monotonic() > deadline:
                await self.stop()
                raise ServiceStartError(
                    f"Kafka cluster: not every node lists all {len(self.nodes)} brokers "
                    f"(node id -> brokers listed: {listed})"
                )
            await asyncio.sleep(0.2)
            with contextlib.suppress(Exception):  # a node still booting refuses or times out
                listed = await self.brokers_listed()
        return self

    def _all_brokers_listed(self, listed: dict[int, int]) -> bool:
        return set(listed) == set(self.nodes) and all(n == len(self.nodes) for n in listed.values())

    async def stop(self) -> None:
        await asyncio.gather(*(n.stop() for n in self.nodes.values()), return_exceptions=True)

    async def kill(self, node_id: int) -> None:
        """SIGKILL one node (its data stays for :meth:`start_node`)."""
        await self.node(node_id).kill()

    async def stop_node(self, node_id: int) -> None:
        """Stop one node gracefully (SIGTERM: a controlled shutdown hands its leaderships over)."""
        await self.node(node_id).stop()

    async def start_node(self, node_id: int) -> ApacheKafka:
        """Bring one node back on its ports with its data; returns once it answers clients."""
        node = self.node(node_id)
        await node.start()
        return node

    def cleanup(self) -> None:
        for node in self.nodes.values():
            node.cleanup()
        if self._owns_run_dir and not any(n.keep_run_dir for n in self.nodes.values()):
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.stop()
        finally:
            self.cleanup()

    # -- metadata ------------------------------------------------------------------------------
    async def brokers_listed(self) -> dict[int, int]:
        """Node id -> how many brokers that node's own metadata lists (each node keeps a copy)."""
        return await brokers_listed_by_each_node(self.live_bootstrap)

    async def partitions(self, topics: Iterable[str]) -> list[PartitionReplicas]:
        """Leader, replicas and ISR of every partition of the named topics (that exist)."""
        async with admin_client(self.live_bootstrap, request_timeout_ms=5000) as admin:
            existing = set(await admin.list_topics())
            wanted = [t for t in topics if t in existing]
            metas = await admin.describe_topics(wanted) if wanted else []
        out = []
        for meta in metas:
            for p in meta.get("partitions") or []:
                out.append(
                    PartitionReplicas(
                        topic=meta["topic"],
                        partition=p["partition"],
                        leader=p["leader"],
                        replicas=tuple(p.get("replicas") or ()),
                        isr=tuple(p.get("isr") or ()),
                    )
                )
        return out

    async def leader_counts(self, topics: Iterable[str]) -> Counter[int]:
        """Node id -> how many partitions of the topics it leads (every node present, maybe 0)."""
        counts: Counter[int] = Counter(dict.fromkeys(self.nodes, 0))
        for p in await self.partitions(topics):
            if p.leader in self.nodes:
                counts[p.leader] += 1
        return counts

    async def busiest_leader(self, topics: Iterable[str]) -> int:
        """The node leading the most partitions of the topics (ties: the lowest node id)."""
        counts = await self.leader_counts(topics)
        return max(sorted(counts), key=lambda node_id: counts[node_id])

    async def under_replicated(self, topics: Iterable[str]) -> list[PartitionReplicas]:
        """Partitions with a replica out of the ISR, or without a leader."""
        return [p for p in await self.partitions(topics) if p.leader < 0 or len(p.isr) < len(p.replicas)]

    async def wait_in_sync(self, topics: Iterable[str], *, timeout: float = 120.0) -> float:
        """Wait until every partition of the topics has a leader and all replicas in sync; returns
        the seconds it took. Raises TimeoutError naming what is still behind."""
        names = list(topics)
        started = time.monotonic()
        behind: list[PartitionReplicas] = []
        while time.monotonic() - started < timeout:
            with contextlib.suppress(Exception):  # a node booting may refuse or time out a request
                behind = await self.under_replicated(names)
                if not behind:
                    return time.monotonic() - started
            await asyncio.sleep(0.5)
        raise TimeoutError(f"replicas not in sync after {timeout:.0f}s: {behind[:5]}")

    async def rolling_restart(
        self, topics: Iterable[str], *, timeout: float = 180.0, on_event: Callable[..., None] | None = None
    ) -> list[dict[str, float]]:
        """Restart the nodes one at a time, as an upgrade does: graceful stop, start, then wait
        until every replica of the topics is back in the ISR before the next node (``on_event(name,
        **detail)`` is told each step). Returns one
        record per node: seconds stopping, starting, and until in sync."""
        names = list(topics)
        steps = []
        for node_id in sorted(self.nodes):
            t0 = time.monotonic()
            if on_event:
                on_event("rolling_stop", node=node_id)
            await self.stop_node(node_id)
            t1 = time.monotonic()
            await self.start_node(node_id)
            t2 = time.monotonic()
            if on_event:
                on_event("rolling_started", node=node_id, seconds=round(t2 - t1, 2))
            in_sync = await self.wait_in_sync(names, timeout=timeout)
            if on_event:
                on_event("rolling_in_sync", node=node_id, seconds=round(in_sync, 2))
            steps.append(
                {
                    "node": node_id,
                    "stop_s": round(t1 - t0, 2),
                    "start_s": round(t2 - t1, 2),
                    "in_sync_s": round(in_sync, 2),
                }
            )
        return steps

    def __repr__(self) -> str:
        return f"<KafkaCluster {len(self.nodes)} nodes {self.bootstrap} run_dir={self.run_dir}>"
