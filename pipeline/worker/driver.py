"""Switchboard's Faust transport driver: Faust's own extension point for the Kafka client.

It differs from Faust's aiokafka driver in four ways:

* The worker consumer is built with Switchboard's consumer settings (`ConsumerTuning`). Faust's
  driver hard-codes `fetch_max_wait_ms=1500`, and Tansu holds every fetch for that long, so every
  hop would wait 1.5 s.
* Fetched records reach the app's stages a batch at a time (`BatchConsumer`), not one record at a
  time through Faust's conductor, channels and streams. On this machine that per-record path costs
  about 150 µs of CPU per record, against about 4 µs for aiokafka's own fetch
  (`bench/faust_delivery_bench.py`).
* The producer is idempotent and waits for every in-sync replica (`acks=all`): a write it retries
  after a broker failure is stored once, and a write it reports done survives the loss of its
  partition's leader (docs/operations.md, "Recommended production settings for Kafka").
* The consumer runs on the app's event loop, not in a thread of its own (`ConsumerThread`).

Offsets stay Faust's: a stage acknowledges each record with `Consumer.ack`, in offset order per
partition, and Faust commits what is acknowledged (periodically, and when partitions are revoked),
with one correction: a commit never passes the record at the committed offset unless it was
acknowledged or is not in the log (`skips_unacknowledged`).
The driver is registered under the URL scheme `switchboard://` through the `faust.transports`
entry point (pyproject.toml); `SwitchboardApp` uses it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

import aiokafka
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message
from mode import ServiceT

from pipeline import metrics
from pipeline.errors import ConfigurationError
from pipeline.kafka.refusals import idempotence_refusal

log = logging.getLogger(__name__)

SCHEME = "switchboard"
_DEFAULT_PARTITIONER = DefaultPartitioner()


@dataclass(frozen=True)
class ConsumerTuning:
    """Consumer settings Faust's driver does not expose."""

    # How long a fetch may wait for data. Tansu answers a fetch only when this runs out.
    fetch_max_wait_ms: int = 20
    # Records per fetch, across partitions: one batch for the stages.
    max_poll_records: int = 500
    # `read_committed` where producers use transactions; Switchboard's do not.
    isolation_level: str = "read_uncommitted"


class BatchSink(Protocol):
    """What the app delivers each topic's fetched records to (a stage's runner)."""

    async def deliver(self, messages: Sequence[Message]) -> None: ...


class BatchApp(Protocol):
    """The app side of the driver (`SwitchboardApp`)."""

    consumer_tuning: ConsumerTuning

    def sink_for(self, topic: str) -> BatchSink | None: ...


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer "thread", run on the app's own event loop, with the worker consumer built
    from Switchboard's settings.

    Faust runs aiokafka's consumer in a thread with an event loop of its own and passes every call
    (each fetch, commit, seek) through a method queue. In a worker that is busy on its own loop
    that costs CPU: cross-thread wake-ups (a self-pipe write per call and per result), the queue's
    futures and tasks, and the two loops contending for the GIL (py-spy: the consumer thread and
    its method queue were 15% of the worker's samples). aiokafka is asyncio-native, so here the
    service's `_serve` runs as a task of the app's loop and calls are awaited directly. The price:
    the consumer's heartbeats share the app's loop, so a loop held longer than the session timeout
    would cost the group membership; the loop watch (`switchboard_event_loop_stalls_total`) shows
    how long the loop is ever held.
    """

    def __init__(self, consumer: faust_aiokafka.Consumer, **kwargs: Any) -> None:
        loop = kwargs.pop("loop", None) or asyncio.get_event_loop_policy().get_event_loop()
        super().__init__(consumer, loop=loop, thread_loop=loop, **kwargs)

    async def start(self) -> None:
        # No thread: the service's body (`_serve`) as a task of this loop.
        assert not self._thread_started.is_set()
        self._thread_started.set()
        self._thread_running = asyncio.Future(loop=self.parent_loop)
        self.add_future(self._serve())
        try:
            if not self.should_stop:
                await self._thread_running
        finally:
            self._thread_running = None

    async def call_thread(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = fun(*args, **kwargs)  # some of the delegated calls are plain functions
        return await result if inspect.isawaitable(result) else result

    async def cast_thread(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        result = fun(*args, **kwargs)
        if inspect.isawaitable(result):
            self.add_future(result)

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        """Faust's commit drops the partitions no longer assigned and hands aiokafka the rest; for a
        commit computed just before a rebalance took every partition it names, the rest is empty,
        which aiokafka refuses with `ValueError({})`, and Faust crashes the worker on it (seen
        under chaos on a loaded machine). Nothing to commit is no commit."""
        assigned = self.assignment()
        mine = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        if not mine:
            return False
        return bool(await super().commit(mine))

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Faust seeks every assigned partition to its committed offset after a rebalance, but
        aiokafka seeks only partitions whose committed offset is above 0: one never committed stays
        wherever the fetcher's position was, while Faust takes its next record to be the first.
        Records read before the rebalance and not finished would then be skipped and, once later
        ones are acknowledged, committed past. Such a partition is read from its beginning."""
        consumer = self._ensure_consumer()
        committed: Mapping[TP, int] = await consumer.seek_to_committed()
        fresh = [tp for tp, offset in committed.items() if not offset or offset <= 0]
        if fresh:
            await consumer.seek_to_beginning(*fresh)
        return committed

    async def _gather_remaining_tasks(self) -> None:
        # The thread version cancels every task of its own loop; here that loop is the app's.
        return None

    def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> aiokafka.AIOKafkaConsumer:
        conf = self.app.conf
        tuning = cast(BatchApp, self.app).consumer_tuning
        # Range assignment gives a worker the same partition numbers of every topic with the same
        # partition count: one worker owns a conversation in every stage.
        self._assignor = RangePartitionAssignor
        request_timeout = conf.broker_request_timeout
        session_timeout = conf.broker_session_timeout
        if session_timeout > request_timeout:
            raise ValueError(
                f"the consumer session timeout ({session_timeout} s) exceeds the request timeout ({request_timeout} s)"
            )
        return aiokafka.AIOKafkaConsumer(
            client_id=conf.broker_client_id,
            group_id=conf.id,
            group_instance_id=conf.consumer_group_instance_id,
            bootstrap_servers=faust_aiokafka.server_list(transport.url, transport.default_port),
            partition_assignment_strategy=[self._assignor],
            enable_auto_commit=False,
            auto_offset_reset=conf.consumer_auto_offset_reset,
            max_poll_records=tuning.max_poll_records,
            max_poll_interval_ms=int((conf.broker_max_poll_interval or 0) * 1000.0),
            max_partition_fetch_bytes=conf.consumer_max_fetch_size,
            fetch_max_wait_ms=tuning.fetch_max_wait_ms,
            request_timeout_ms=int(request_timeout * 1000.0),
            check_crcs=conf.broker_check_crcs,
            session_timeout_ms=int(session_timeout * 1000.0),
            rebalance_timeout_ms=int(conf.broker_rebalance_timeout * 1000.0),
            heartbeat_interval_ms=int(conf.broker_heartbeat_interval * 1000.0),
            isolation_level=tuning.isolation_level,
            metadata_max_age_ms=conf.consumer_metadata_max_age_ms,
            connections_max_idle_ms=conf.consumer_connections_max_idle_ms,
            **faust_aiokafka.credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
        )


class OffsetGaps(Protocol):
    """Faust's per-partition record of offsets that will never come (an `IntervalTree`)."""

    def overlaps_point(self, p: int) -> bool: ...


def skips_unacknowledged(committed: int | None, acked: Set[int], gaps: OffsetGaps) -> bool:
    """Whether committing what is acknowledged would pass the record at `committed` (the offset
    read next, as Kafka commits it): later records are acknowledged, and that one neither was nor
    is a gap in the log.

    Faust checks this one offset too late (`min(acked) - committed > 1`, faust-streaming#606), so
    a single record at the head that no stage acknowledged is committed past and never read again.
    Stages acknowledge in offset order per partition, so here it means the record was handed to no
    stage: a delivery cut short by a rebalance, not read again."""
    return committed is not None and bool(acked) and committed not in acked and not gaps.overlaps_point(committed)


class BatchConsumer(faust_aiokafka.Consumer):
    """Delivers each fetch to the stages as one batch per topic, in offset order per partition."""

    # How long a partition read again is left to catch up before it may be read again once more:
    # records redelivered from the committed offset queue behind the ones still running.
    read_again_after: ClassVar[float] = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Partitions just sought to a committed offset: their next record says whether the records
        # from that offset on are still in the log.
        self._sought: set[TP] = set()
        # Where each partition with nothing committed was first read from since its last seek: the
        # offset its first commit must not pass unacknowledged.
        self._first_read: dict[TP, int] = {}
        # Partitions whose commit is held (`skips_unacknowledged`), to be read again from their
        # committed offset; and when each was last read again.
        self._held: set[TP] = set()
        self._read_again_at: dict[TP, float] = {}
        super().__init__(*args, **kwargs)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def read_offset(self, tp: TP) -> int | None:
        """The last offset delivered from `tp` (None before the first)."""
        return self._read_offset.get(tp)

    def committed_offset(self, tp: TP) -> int | None:
        """The offset last committed for `tp` (None before the first commit)."""
        return self._committed_offset.get(tp)

    def _commit_start(self, tp: TP) -> int | None:
        """The offset the next commit of `tp` starts from."""
        committed = self._committed_offset[tp]
        return committed if committed is not None else self._first_read.get(tp)

    def _new_offset(self, tp: TP) -> int | None:
        if skips_unacknowledged(self._commit_start(tp), self._acked_index[tp], self._gap[tp]):
            if tp not in self._held:
                self._held.add(tp)
                metrics.COMMITS_HELD.labels(tp.topic).inc()
            return None
        return cast("int | None", super()._new_offset(tp))

    async def perform_seek(self) -> None:
        await super().perform_seek()
        self._sought = set()
        for tp, offset in self._read_offset.items():
            if offset is not None:
                self._sought.add(tp)
            else:  # nothing committed: read from the start again
                self._first_read.pop(tp, None)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        await super().on_partitions_revoked(revoked)  # its commit still guarded
        for tp in revoked:
            self._sought.discard(tp)
            self._first_read.pop(tp, None)
            self._held.discard(tp)

    async def _read_held_again(self) -> None:
        """Seek each partition whose commit is held back to where that commit starts (`_commit_start`),
        so the record no stage acknowledged is delivered again (and the ones after it, harmlessly)."""
        now = self.loop.time()
        assigned = self.assignment()
        for tp in list(self._held):
            start = self._commit_start(tp)
            if tp not in assigned or start is None:
                self._held.discard(tp)  # revoked: its next owner reads from the committed offset
                continue
            if now - self._read_again_at.get(tp, -self.read_again_after) < self.read_again_after:
                continue
            self._held.discard(tp)
            self._read_again_at[tp] = now
            log.warning(
                "%s[%d]: offset %d was never acknowledged while later ones were; reading again from it",
                tp.topic,
                tp.partition,
                start,
            )
            await self.seek(tp, start)
            self._sought.add(tp)

    async def _drain_messages(self, fetcher: ServiceT) -> None:
        """Faust's fetch loop, delivering batches: read offsets and gaps are kept as Faust keeps
        them, except that a seek's first record marks what the log no longer has as a gap; a
        rebalance (`suspend_flow`) cuts a delivery short, and what was not delivered is fetched
        again from the committed offsets afterwards."""
        app = cast(BatchApp, self.app)
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        commit_every = self._commit_every
        first_read = self._first_read
        while not (self.should_stop or fetcher.should_stop):
            batches: dict[str, list[Message]] = {}
            await self.sleep(0)
            if self.should_stop:
                break
            if self._held:
                await self._read_held_again()
            async for tp, message in self.getmany(timeout=1.0):
                offset = message.offset
                last = read_offset[tp]
                if last is not None and offset < last:
                    continue  # read before a seek back: its replay comes in order
                if last is None:  # read from the start (nothing committed, or a seek to 0)
                    first_read.setdefault(tp, offset)
                    self._sought.discard(tp)
                elif tp in self._sought:
                    # The first record since a seek, where `last` is the offset to read next (not
                    # the last one read): offsets before this one are no longer in the log.
                    self._sought.discard(tp)
                    if offset > last and acks_enabled_for(message.topic):
                        self._gap[tp].addi(last, offset)
                elif offset - last > 1 and acks_enabled_for(message.topic):
                    await self._add_gap(tp, last + 1, offset)  # offsets that will never come
                read_offset[tp] = offset
                batches.setdefault(message.topic, []).append(message)
            if not batches:
                continue
            if commit_every is not None and self._n_acked >= commit_every:
                self._n_acked = 0
                await self.commit()
            await self.wait_first(self._deliver(app, batches), self.suspend_flow.wait())

    async def _deliver(self, app: BatchApp, batches: Mapping[str, list[Message]]) -> None:
        for topic, messages in batches.items():
            sink = app.sink_for(topic)
            if sink is None:
                log.warning("no stage for %d record(s) of %s; left unacknowledged", len(messages), topic)
                continue
            await sink.deliver(messages)


class Producer(faust_aiokafka.Producer):
    """Faust's producer with `acks=all`, idempotent unless the app's `idempotent_producer` is False
    (Faust itself turns idempotence on only inside transactions)."""

    def _settings_extra(self) -> Mapping[str, object]:
        idempotent = bool(getattr(self.app, "idempotent_producer", True))
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": idempotent}

    async def on_start(self) -> None:
        try:
            await super().on_start()
        except Exception as exc:
            # A broker refusing the idempotent producer's InitProducerId: aiokafka says only
            # `UnknownError()`; say which setting avoids it (`switchboard worker` checks this
            # before it starts; this covers a broker changed since, or a worker started in code).
            servers = self._settings_default().get("bootstrap_servers", "")
            bootstrap = servers if isinstance(servers, str) else ",".join(map(str, servers))
            refusal = idempotence_refusal(exc, bootstrap)
            if refusal is None or not getattr(self.app, "idempotent_producer", True):
                raise
            raise ConfigurationError(refusal) from exc


class Transport(faust_aiokafka.Transport):
    """The driver registered as `switchboard://`."""

    Consumer: ClassVar[type[BatchConsumer]] = BatchConsumer
    Producer: ClassVar[type[Producer]] = Producer
    driver_version = f"switchboard+aiokafka={aiokafka.__version__}"


def broker_url(bootstrap: str) -> str:
    """The app's broker URL for bootstrap servers `host:port[,host:port…]`."""
    return f"{SCHEME}://{bootstrap}"


class KeyPartitioner:
    """aiokafka's default partitioner (Java-compatible murmur2 of the key), remembering each key's
    hash: aiokafka's murmur2 is pure Python, ~20 µs per record, and a busy worker sends the same
    few thousand conversation keys over and over. Installed as Faust's `producer_partitioner`."""

    def __init__(self, max_keys: int = 65_536) -> None:
        self._hashes: dict[bytes, int] = {}
        self._max_keys = max_keys

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return _DEFAULT_PARTITIONER(key, all_partitions, available)
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self._max_keys:
                self._hashes.clear()  # a bound, not an LRU: refilling is cheap
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


__all__ = [
    "SCHEME",
    "BatchApp",
    "BatchSink",
    "ConsumerTuning",
    "KeyPartitioner",
    "Producer",
    "Transport",
    "broker_url",
]
