"""Consumer lag: committed offset vs high watermark, per topic/partition, for one group.

Committed offsets are read with OffsetFetch for *explicit* partitions: asking a broker for "all
partitions of the group" (topics=null) works on Apache Kafka but Tansu answers it with a response
aiokafka cannot decode. High watermarks come from ListOffsets through a group-less consumer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.kafka.exceptions import BrokerUnavailableError
from pipeline.redact import redact_url


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    #: next offset the group will read; None when the group has committed nothing here
    committed: int | None
    high_watermark: int
    #: records not yet consumed (from offset 0 when nothing is committed)
    lag: int


@dataclass(frozen=True)
class GroupLag:
    group: str
    partitions: list[PartitionLag]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)

    def by_topic(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.topic] = out.get(p.topic, 0) + p.lag
        return out


class LagReader:
    """Long-lived lag reader (one admin client + one group-less consumer), e.g. for a metrics loop.

    ``async with LagReader(bootstrap) as r: lag = await r.read("group", ["topic"])``
    """

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 15000) -> None:
        self.bootstrap = bootstrap
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=request_timeout_ms,
        )
        self._started = False

    async def start(self) -> None:
        if self._started:
            return
        try:
            await self._admin.start()
            await self._consumer.start()
        except Exception as exc:
            await self.stop()
            raise BrokerUnavailableError(
                f"cannot reach Kafka at {redact_url(self.bootstrap)}: {redact_url(str(exc))}"
            ) from exc
        self._started = True

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._consumer.stop()
        with contextlib.suppress(Exception):
            await self._admin.close()
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def read(self, group: str, topics: Iterable[str] | None = None) -> GroupLag:
        """Lag of ``group`` on ``topics`` (default: every non-internal topic where it committed)."""
        existing = {t for t in await self._admin.list_topics() if not t.startswith("__")}
        explicit = topics is not None
        names = sorted(existing & set(topics)) if topics is not None else sorted(existing)
        if not names:
            return GroupLag(group, [])
        tps: list[TopicPartition] = []
        for meta in await self._admin.describe_topics(names):
            if meta.get("error_code"):
                continue
            tps += [TopicPartition(meta["topic"], p["partition"]) for p in meta.get("partitions") or []]
        if not tps:
            return GroupLag(group, [])
        committed = await self._admin.list_consumer_group_offsets(group, partitions=tps)
        highs = await self._consumer.end_offsets(tps)
        out: list[PartitionLag] = []
        for tp in sorted(tps):
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            if offset is None and not explicit:
                continue  # the group does not read this topic
            high = highs.get(tp, 0)
            lag = max(high - (offset if offset is not None else 0), 0)
            out.append(PartitionLag(tp.topic, tp.partition, offset, high, lag))
        return GroupLag(group, out)


async def consumer_lag(bootstrap: str, group: str, topics: Iterable[str] | None = None) -> GroupLag:
    """One-shot :meth:`LagReader.read`."""
    async with LagReader(bootstrap) as reader:
        return await reader.read(group, topics)
