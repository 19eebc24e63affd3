"""Finer hop stamps for `switchboard bench` (`SWITCHBOARD_HOP_STAMPS`; off by default).

A record's `hops` always carry one stamp per stage. With these on, each Kafka hop into a stage
(`ingest`, `dispatch`, `render`, `egress`) also gets, in the same `hops`, wall-clock milliseconds:

    <stage>.sent     the sending side called produce (taken just before the record is serialised)
    <stage>.acked    the sending side's producer saw the broker's acknowledgement of it
    <stage>.fetched  the consuming stage was given it (`StageRunner.deliver`, right after a fetch)
    <stage>.stepped  the stage's batch step for its batch returned (parse + one Redis call per batch)
    <stage>.started  the stage's work for it started (the keyed executor ran it)

so the bench can split each hop into produce, broker + fetch, step, queue and handle
(`pipeline.bench.hops`). The acknowledgement is known only to the producer, after the record has
left: `ACKS` joins it to the record as the consumer reads it, by (topic, partition, offset), when
the producer and the consumer are one process (one worker, or the bare turn's worker).

Off, each path pays one module attribute read; on, a few dict writes per record and hop.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

# Read on the hot paths (`hopstamps.enabled`): set once at start from the settings.
enabled = False


def enable(on: bool) -> None:
    global enabled
    enabled = on


def now_ms() -> float:
    return time.time() * 1000.0


def sent(hops: dict[str, float], to_stage: str) -> None:
    """The record carrying `hops` is about to be produced to `to_stage`'s topic. Inside a stage's
    work (`working`), that work's start goes along too: a work may produce for records other than
    the one it was given (a chat's turns of one batch, a conversation's events)."""
    work = _work.get()
    if work is not None and work.task is asyncio.current_task():
        hops[f"{work.stage}.started"] = work.started
    hops[f"{to_stage}.sent"] = now_ms()


class _Work(NamedTuple):
    stage: str
    started: float
    task: asyncio.Task[Any] | None  # a task spawned by the work inherits the context, not the work


_work: ContextVar[_Work | None] = ContextVar("switchboard_hopstamps_work", default=None)


@contextmanager
def working(stage: str, hops: dict[str, float]) -> Iterator[None]:
    """A stage's work for the record carrying `hops` runs inside this."""
    started = now_ms()
    hops[f"{stage}.started"] = started
    token = _work.set(_Work(stage, started, asyncio.current_task()))
    try:
        yield
    finally:
        _work.reset(token)


class AckJoin:
    """The producer's acknowledgement time of each record, joined to the record's `hops` when the
    consumer reads it. Whichever of the two comes second writes the stamp (the broker answers the
    producer and the consumer's fetch at about the same moment). Bounded: records produced or
    consumed by another process never find their other half, and the oldest are dropped (joined
    ones leave within milliseconds; the bound keeps a backlog produced elsewhere, such as the
    bench's filtered drain, from holding more than a few MiB)."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._acked: OrderedDict[tuple[str, int, int], float] = OrderedDict()
        self._waiting: OrderedDict[tuple[str, int, int], tuple[dict[str, float], str]] = OrderedDict()

    def acked(self, topic: str, partition: int, offset: int, at: float) -> None:
        key = (topic, partition, offset)
        waiting = self._waiting.pop(key, None)
        if waiting is not None:
            hops, name = waiting
            hops[name] = at
            return
        _put(self._acked, key, at, self.limit)

    def read(self, topic: str, partition: int, offset: int, hops: dict[str, float], name: str) -> None:
        key = (topic, partition, offset)
        at = self._acked.pop(key, None)
        if at is not None:
            hops[name] = at
            return
        _put(self._waiting, key, (hops, name), self.limit)

    def on_delivery(self, delivery: asyncio.Future[Any]) -> None:
        """A done callback for a producer's delivery future (aiokafka's `RecordMetadata`)."""
        if delivery.cancelled() or delivery.exception() is not None:
            return
        metadata = delivery.result()
        self.acked(metadata.topic, metadata.partition, metadata.offset, now_ms())

    def __len__(self) -> int:
        return len(self._acked) + len(self._waiting)


def _put(table: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    if len(table) >= limit:
        # The oldest, in O(1). (`del d[next(iter(d))]` on a plain dict scans past every slot
        # deleted before it: on a full table that was most of a filtered drain's worker CPU.)
        table.popitem(last=False)
    table[key] = value


ACKS = AckJoin()
