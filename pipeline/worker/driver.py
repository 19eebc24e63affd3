"""Switchboard's Faust transport driver: Faust's own extension point for the Kafka client.

Faust hosts the worker (lifecycle, signals, the rebalance protocol and its recovery step); this
driver is the Kafka side, written against public interfaces only: Faust's `ConsumerT` and
`ProducerT` (and its base `Transport`, whose `Consumer`, `Producer` and `Fetcher` class attributes
are how a driver plugs in), mode's `Service`, and aiokafka's public client API. It is registered
under the URL scheme `switchboard://` through the `faust.transports` entry point (pyproject.toml);
`SwitchboardApp` uses it. `tests/worker/test_driver_api.py` pins what it relies on.

What it does differently from Faust's own aiokafka driver:

* The consumer is built with Switchboard's settings (`ConsumerTuning`). Faust's driver hard-codes
  `fetch_max_wait_ms=1500`, and Tansu holds every fetch for that long, so every hop would wait
  1.5 s.
* Fetched records reach the app's stages a batch at a time per topic (`BatchSink.deliver`), not
  one record at a time through Faust's conductor, channels and streams. On this machine that
  per-record path costs about 150 µs of CPU per record, against about 4 µs for aiokafka's own
  fetch (`bench/faust_delivery_bench.py`).
* The consumer runs on the app's event loop: no consumer thread and no method queue in between.
  The price: heartbeats share the app's loop, so a loop held longer than the session timeout would
  cost the group membership; the loop watch (`switchboard_event_loop_stalls_total`) shows how long
  the loop is ever held.
* Offsets are Switchboard's own (`PartitionProgress`): a stage acknowledges each record with
  `SwitchboardConsumer.ack`, in offset order per partition, and a commit stores the offset after
  the last record acknowledged with every earlier one (periodically, every `broker_commit_every`
  acknowledgements, and when partitions are revoked). A record no stage acknowledged while later
  ones were is read again, never committed past.
* The producer is idempotent and waits for every in-sync replica (`acks=all`): a write it retries
  after a broker failure is stored once, and a write it reports done survives the loss of its
  partition's leader (docs/operations.md, "Recommended production settings for Kafka").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

import aiokafka
import mode
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, ConsumerStoppedError, IllegalStateError, KafkaError
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.exceptions import ConsumerNotStarted, ProducerSendError
from faust.transport import base as faust_base
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth, server_list
from faust.types import TP, AppT, HeadersArg, Message, RecordMetadata
from faust.types.transports import (
    ConsumerCallback,
    ConsumerT,
    PartitionsAssignedCallback,
    PartitionsRevokedCallback,
    ProducerT,
    TPorTopicSet,
    TransactionManagerT,
    TransportT,
)
from mode import Seconds, ServiceT

from pipeline import metrics
from pipeline.errors import ConfigurationError
from pipeline.kafka.refusals import idempotence_refusal

from .offsets import PartitionProgress

log = logging.getLogger(__name__)

SCHEME = "switchboard"
DEFAULT_PORT = 9092
_DEFAULT_PARTITIONER = DefaultPartitioner()


@dataclass(frozen=True)
class ConsumerTuning:
    """Consumer settings Faust's settings do not have."""

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


# Faust's app passes its assignment callback the rebalance's generation too (its recovery step
# compares it with `app.consumer_generation_id` to tell a rebalance superseded by a newer one).
AssignedWithGeneration = Callable[[set[TP], int], Awaitable[None]]


def kafka_tp(tp: TP) -> aiokafka.TopicPartition:
    return aiokafka.TopicPartition(tp.topic, tp.partition)


def faust_tp(tp: aiokafka.TopicPartition) -> TP:
    return TP(tp.topic, tp.partition)


def bootstrap_servers(transport: TransportT) -> list[str]:
    return cast(list[str], server_list(transport.url, DEFAULT_PORT))


class _RebalanceListener(aiokafka.ConsumerRebalanceListener):
    """aiokafka's rebalance callbacks, handed to the consumer (aiokafka awaits them)."""

    def __init__(self, consumer: SwitchboardConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Iterable[aiokafka.TopicPartition]) -> None:
        await self.consumer.on_partitions_revoked({faust_tp(tp) for tp in revoked})

    async def on_partitions_assigned(self, assigned: Iterable[aiokafka.TopicPartition]) -> None:
        await self.consumer.on_partitions_assigned({faust_tp(tp) for tp in assigned})


class SwitchboardConsumer(mode.Service, ConsumerT):
    """Faust's consumer interface over `aiokafka.AIOKafkaConsumer`, on the app's event loop.

    Faust's app drives it: the conductor subscribes the app's topics; a rebalance calls the app's
    revocation callback (which stops the flow), then its assignment callback, and Faust's recovery
    step then seeks the assigned partitions to their committed offsets (`perform_seek`), resumes
    the flow and starts the `Fetcher`, whose task runs `fetch_loop`.
    """

    # How long a partition read again is left to catch up before it may be read again once more:
    # records redelivered from the first unacknowledged one queue behind the ones still running.
    read_again_after: ClassVar[float] = 30.0
    # How long one fetch waits for records before the loop looks at flow and pauses again.
    fetch_timeout: ClassVar[float] = 1.0

    def __init__(
        self,
        transport: TransportT,
        callback: ConsumerCallback,
        on_partitions_revoked: PartitionsRevokedCallback,
        on_partitions_assigned: PartitionsAssignedCallback,
        *,
        commit_interval: float | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        **kwargs: Any,
    ) -> None:
        self.transport = transport
        self.app: AppT = transport.app
        if self.app.in_transaction:
            raise ConfigurationError("Switchboard's Kafka driver does not run Faust's exactly-once transactions")
        # `callback` is the conductor's per-record path, which this driver replaces with batches.
        self.revoked_callback = on_partitions_revoked
        self.assigned_callback = cast(AssignedWithGeneration, on_partitions_assigned)
        conf = self.app.conf
        self.commit_interval = commit_interval or conf.broker_commit_interval
        self.commit_every: int | None = conf.broker_commit_every
        self.randomly_assigned_topics: set[str] = set()
        self.in_transaction = False
        self.scheduler = cast(Callable[[], Any], conf.ConsumerScheduler)()
        self.kafka: aiokafka.AIOKafkaConsumer | None = None
        self.progress: dict[TP, PartitionProgress] = {}
        self.paused: set[TP] = set()
        self.flow_active = True
        self.flow_stopped = asyncio.Event()  # set while the flow is stopped
        self.flow_resumed = asyncio.Event()  # set while the flow runs
        self.flow_resumed.set()
        self.partitions_changed = asyncio.Event()
        self.generation = 0
        self.acked_since_commit = 0
        self.commit_lock = asyncio.Lock()
        # Partitions whose commit is held (`PartitionProgress.held`), and when each was read again.
        self.held: set[TP] = set()
        self.read_again_at: dict[TP, float] = {}
        super().__init__(loop=loop, **kwargs)
        self.transactions: TransactionManagerT = cast(faust_base.Transport, transport).create_transaction_manager(
            consumer=self, producer=self.app.producer, beacon=self.beacon, loop=self.loop
        )

    # --- lifecycle --------------------------------------------------------------------------

    def new_kafka_consumer(self) -> aiokafka.AIOKafkaConsumer:
        """aiokafka's consumer with Faust's broker settings and Switchboard's `ConsumerTuning`."""
        conf = self.app.conf
        tuning = cast(BatchApp, self.app).consumer_tuning
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
            bootstrap_servers=bootstrap_servers(self.transport),
            # Range assignment gives a worker the same partition numbers of every topic with the
            # same partition count: one worker owns a conversation in every stage.
            partition_assignment_strategy=[RangePartitionAssignor],
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
            **credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
        )

    async def on_start(self) -> None:
        kafka = self.new_kafka_consumer()
        await kafka.start()
        self.kafka = kafka

    async def on_stop(self) -> None:
        kafka = self.kafka
        if kafka is None:
            return
        try:
            await self.commit()
        finally:
            self.kafka = None
            await kafka.stop()

    @mode.Service.task
    async def _commit_periodically(self) -> None:
        interval = self.commit_interval
        await self.sleep(interval)
        async for _ in self.itertimer(interval, name="commit"):
            await self.commit()

    def running(self) -> aiokafka.AIOKafkaConsumer:
        if self.kafka is None:
            raise ConsumerNotStarted("the consumer is not started")
        return self.kafka

    def close(self) -> None:
        """A rebalance reached a stopping app: fetch nothing more (`on_stop` stops aiokafka)."""
        self.stop_flow()

    # --- subscription and rebalances --------------------------------------------------------

    async def subscribe(self, topics: Iterable[str]) -> None:
        self.running().subscribe(topics=sorted(set(topics)), listener=_RebalanceListener(self))

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Before a rebalance: the app stops the flow and tells the stages (whose work of revoked
        partitions no longer acknowledges); what is acknowledged is committed; the partitions'
        progress is forgotten (their next owner reads from the committed offsets)."""
        self.app.on_rebalance_start()
        await self.revoked_callback(revoked)
        try:
            await self.commit()
        except Exception:  # the records are read again from the last commit: no reason to stop
            log.exception("commit on revocation failed")
        for tp in revoked:
            self.progress.pop(tp, None)
            self.held.discard(tp)
        self.paused -= revoked

    async def on_partitions_assigned(self, assigned: set[TP]) -> None:
        self.generation += 1
        self.app.consumer_generation_id = self.generation
        self.paused &= assigned
        for tp in set(self.progress) - assigned:
            self.progress.pop(tp)
        for tp in assigned:
            self.progress.setdefault(tp, PartitionProgress())
        await self.assigned_callback(assigned, self.generation)
        self.app.on_rebalance_return()

    async def perform_seek(self) -> None:
        """Seek every assigned partition to its committed offset, and one with nothing committed to
        its beginning: records read before the rebalance and not finished are read again."""
        kafka = self.running()
        assigned = list(self.assignment())
        # One request per partition (aiokafka asks for one at a time): asked all at once.
        offsets = await asyncio.gather(*(kafka.committed(kafka_tp(tp)) for tp in assigned))
        committed: dict[TP, int | None] = dict(zip(assigned, offsets, strict=True))
        fresh = [kafka_tp(tp) for tp, offset in committed.items() if offset is None or offset < 0]
        for tp, offset in committed.items():
            if offset is not None and offset >= 0:
                kafka.seek(kafka_tp(tp), offset)
        if fresh:
            await kafka.seek_to_beginning(*fresh)
        for tp, offset in committed.items():
            known = offset if offset is not None and offset >= 0 else None
            progress = self.progress[tp] = PartitionProgress(committed=known)
            if known is not None:
                progress.seek(known)
            self.held.discard(tp)

    # --- flow and pauses ---------------------------------------------------------------------

    def stop_flow(self) -> None:
        self.flow_active = False
        self.flow_resumed.clear()
        self.flow_stopped.set()

    def resume_flow(self) -> None:
        self.flow_active = True
        self.flow_stopped.clear()
        self.flow_resumed.set()

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        tpset = {TP(tp.topic, tp.partition) for tp in tps}
        self.paused |= tpset
        kafka = self.kafka
        if kafka is not None:
            assigned = kafka.assignment()
            kafka.pause(*(t for t in map(kafka_tp, tpset) if t in assigned))
        self.partitions_changed.set()

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        tpset = {TP(tp.topic, tp.partition) for tp in tps}
        self.paused -= tpset
        kafka = self.kafka
        if kafka is not None:
            assigned = kafka.assignment()
            kafka.resume(*(t for t in map(kafka_tp, tpset) if t in assigned))
        self.partitions_changed.set()

    # --- fetching ---------------------------------------------------------------------------

    async def fetch_loop(self, fetcher: ServiceT) -> None:
        """Fetch and deliver until the consumer or `fetcher` stops: each fetch goes to the stages
        as one batch per topic, in offset order per partition. A rebalance (`stop_flow`) cuts a
        delivery short; what was not delivered is read again from the committed offsets."""
        app = cast(BatchApp, self.app)
        try:
            while not (self.should_stop or fetcher.should_stop):
                if not self.flow_active:
                    await self.wait_first(self.flow_resumed.wait())
                    continue
                if self.held:
                    await self.read_held_again()
                batches = await self.fetch()
                if not batches:
                    continue
                if self.commit_every is not None and self.acked_since_commit >= self.commit_every:
                    await self.commit()
                await self.wait_first(self.deliver(app, batches), self.flow_stopped.wait())
        except (ConsumerStoppedError, ConsumerNotStarted):
            if not (self.app.should_stop or self.should_stop):
                raise
            log.info("the consumer stopped while the worker stops")

    async def fetch(self, timeout: float | None = None) -> dict[str, list[Message]]:
        """One fetch from the active partitions, as each topic's records to deliver."""
        kafka = self.running()
        wait = self.fetch_timeout if timeout is None else timeout
        active = [kafka_tp(tp) for tp in self.assignment() - self.paused]
        if not active:
            self.partitions_changed.clear()
            await self.wait_first(self.partitions_changed.wait(), timeout=wait)
            return {}
        generation = self.generation
        records = await kafka.getmany(*active, timeout_ms=int(wait * 1000))
        if generation != self.generation or not self.flow_active:
            # Fetched while a rebalance began (or ended: its seek may precede these records). Put
            # each partition's position back where these records start, so none is skipped;
            # aiokafka returns records only from a partition's current position.
            assigned = kafka.assignment()
            for ktp, tp_records in records.items():
                if tp_records and ktp in assigned:
                    kafka.seek(ktp, tp_records[0].offset)
            return {}
        batches: dict[str, list[Message]] = {}
        progress = self.progress
        for ktp, tp_records in records.items():
            tp = faust_tp(ktp)
            partition = progress.get(tp)
            if partition is None:
                continue  # revoked while fetched
            for record in tp_records:
                if not partition.accepts(record.offset):
                    continue  # read before a seek back: its replay comes in order
                message = Message(
                    record.topic,
                    record.partition,
                    record.offset,
                    record.timestamp / 1000.0 if record.timestamp is not None else cast(float, None),
                    record.timestamp_type,
                    record.headers,
                    record.key,
                    record.value,
                    record.checksum,
                    record.serialized_key_size,
                    record.serialized_value_size,
                    tp,
                    generation_id=generation,
                )
                partition.delivered(message)
                batches.setdefault(record.topic, []).append(message)
        return batches

    async def deliver(self, app: BatchApp, batches: Mapping[str, list[Message]]) -> None:
        for topic, messages in batches.items():
            sink = app.sink_for(topic)
            if sink is None:
                log.warning("no stage for %d record(s) of %s; left unacknowledged", len(messages), topic)
                continue
            await sink.deliver(messages)

    async def read_held_again(self) -> None:
        """Seek each partition whose commit is held back to its first unacknowledged record, so it
        is delivered again (and the ones after it, harmlessly)."""
        now = self.loop.time()
        for tp in list(self.held):
            partition = self.progress.get(tp)
            start = partition.first_unacknowledged if partition is not None else None
            if partition is None or start is None or not partition.held:
                self.held.discard(tp)
                continue
            if now - self.read_again_at.get(tp, -self.read_again_after) < self.read_again_after:
                continue
            self.held.discard(tp)
            self.read_again_at[tp] = now
            log.warning(
                "%s[%d]: offset %d was never acknowledged while later ones were; reading again from it",
                tp.topic,
                tp.partition,
                start,
            )
            await self.seek(tp, start)

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        """Faust's per-record form of `fetch` (this driver's `Fetcher` delivers batches)."""
        for messages in (await self.fetch(timeout)).values():
            for message in messages:
                yield message.tp, message

    # --- acknowledgements and commits ---------------------------------------------------------

    def ack(self, message: Message) -> bool:
        """A stage is done with `message` (and every earlier record of its partition)."""
        partition = self.progress.get(message.tp)
        if partition is None or not partition.ack(message):
            return False
        message.acked = True
        self.acked_since_commit += 1
        return True

    def offsets_to_commit(self, topics: TPorTopicSet | None = None) -> dict[TP, int]:
        offsets: dict[TP, int] = {}
        for tp, partition in self.progress.items():
            if topics is not None and tp not in topics and tp.topic not in topics:
                continue
            if partition.held and tp not in self.held:
                self.held.add(tp)
                metrics.COMMITS_HELD.labels(tp.topic).inc()
            offset = partition.to_commit()
            if offset is not None:
                offsets[tp] = offset
        return offsets

    async def commit(self, topics: TPorTopicSet | None = None, start_new_transaction: bool = True) -> bool:
        """Commit what the stages acknowledged, once what they produced is with the broker. A
        commit that would name only partitions no longer assigned is no commit."""
        kafka = self.kafka
        if kafka is None:
            return False
        async with self.commit_lock:
            self.acked_since_commit = 0
            offsets = self.offsets_to_commit(topics)
            if not offsets:
                return False
            await self.app.producer.flush()
            assigned = self.assignment()
            offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
            if not offsets:
                return False
            try:
                await kafka.commit({kafka_tp(tp): offset for tp, offset in offsets.items()})
            except (CommitFailedError, IllegalStateError) as exc:
                # The group rebalanced meanwhile: the partitions' next owner reads from the last
                # commit that succeeded.
                log.warning("commit not made (%s); the records are read again after the rebalance", exc)
                return False
            for tp, offset in offsets.items():
                partition = self.progress.get(tp)
                if partition is not None and (partition.committed is None or offset > partition.committed):
                    partition.committed = offset
            return True

    async def wait_empty(self) -> None:
        """Faust's wait for its streams (`stream_wait_empty`); stages track their own work."""
        await self.commit()

    async def on_task_error(self, exc: BaseException) -> None:
        await self.commit()

    # --- where the consumer stands ----------------------------------------------------------

    def assignment(self) -> set[TP]:
        return {faust_tp(tp) for tp in self.running().assignment()}

    def read_offset(self, tp: TP) -> int | None:
        """The last offset delivered from `tp` (None before the first)."""
        partition = self.progress.get(tp)
        return partition.read if partition is not None else None

    def committed_offset(self, tp: TP) -> int | None:
        """The offset last committed for `tp` (None before the first commit)."""
        partition = self.progress.get(tp)
        return partition.committed if partition is not None else None

    def highwater(self, tp: TP) -> int:
        """The offset after the last record in `tp`, as the last fetch response told it (None
        before one)."""
        return cast(int, self.running().highwater(kafka_tp(tp)))

    async def highwaters(self, *partitions: TP) -> Mapping[TP, int]:
        ends = await self.running().end_offsets([kafka_tp(tp) for tp in partitions])
        return {faust_tp(tp): offset for tp, offset in ends.items()}

    async def earliest_offsets(self, *partitions: TP) -> Mapping[TP, int]:
        starts = await self.running().beginning_offsets([kafka_tp(tp) for tp in partitions])
        return {faust_tp(tp): offset for tp, offset in starts.items()}

    async def position(self, tp: TP) -> int | None:
        return cast("int | None", await self.running().position(kafka_tp(tp)))

    async def seek(self, partition: TP, offset: int) -> None:
        self.running().seek(kafka_tp(partition), offset)
        progress = self.progress.get(partition)
        if progress is not None:
            progress.seek(offset)

    async def seek_wait(self, partitions: Mapping[TP, int]) -> None:
        for tp, offset in partitions.items():
            await self.seek(tp, offset)
        for tp in partitions:
            await self.position(tp)

    def topic_partitions(self, topic: str) -> int | None:
        partitions = self.running().partitions_for_topic(topic)
        return len(partitions) if partitions else None

    def key_partition(self, topic: str, key: bytes | None, partition: int | None = None) -> int | None:
        if partition is not None:
            return partition
        partitions = self.running().partitions_for_topic(topic)
        if not partitions:
            return None
        ordered = sorted(partitions)
        return cast(int, _DEFAULT_PARTITIONER(key, ordered, ordered))

    @property
    def unacked(self) -> set[Message]:
        return {message for partition in self.progress.values() for message in partition.unacknowledged}

    # --- parts of Faust's interface for its streams and tables, which Switchboard does not use --

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication: int,
        *,
        config: Mapping[str, Any] | None = None,
        timeout: Seconds = 30.0,
        retention: Seconds | None = None,
        compacting: bool | None = None,
        deleting: bool | None = None,
        ensure_created: bool = False,
    ) -> None:
        log.warning("not declaring %s: Switchboard declares its topics itself (`switchboard topics apply`)", topic)

    def track_message(self, message: Message) -> None:
        return None

    def verify_recovery_event_path(self, now: float, tp: TP) -> None:
        return None

    def on_buffer_full(self, tp: TP) -> None:
        return None

    def on_buffer_drop(self, tp: TP) -> None:
        return None


class Fetcher(mode.Service):
    """Runs the consumer's fetch loop; Faust's recovery step starts it once partitions are
    assigned and sought, and the app stops it before the consumer."""

    def __init__(self, app: AppT, **kwargs: Any) -> None:
        self.app = app
        super().__init__(**kwargs)

    @mode.Service.task
    async def _fetch(self) -> None:
        consumer = self.app.consumer
        if not isinstance(consumer, SwitchboardConsumer):
            raise ConfigurationError("Switchboard's fetcher needs Switchboard's consumer")
        await consumer.fetch_loop(self)


class Producer(faust_base.Producer):
    """Faust's producer interface over `aiokafka.AIOKafkaProducer`, with `acks=all`, idempotent
    unless the app's `idempotent_producer` is False (Faust's own driver turns idempotence on only
    inside transactions)."""

    def __init__(self, transport: TransportT, loop: asyncio.AbstractEventLoop | None = None, **kwargs: Any) -> None:
        self.kafka: aiokafka.AIOKafkaProducer | None = None
        super().__init__(transport, loop=loop, **kwargs)

    @property
    def idempotent(self) -> bool:
        return bool(getattr(self.app, "idempotent_producer", True))

    def aiokafka_settings(self) -> dict[str, Any]:
        """What aiokafka's producer is built with: Faust's producer settings, and these."""
        conf = self.app.conf
        return {
            "bootstrap_servers": bootstrap_servers(self.transport),
            "client_id": self.client_id,
            "acks": "all",
            "enable_idempotence": self.idempotent,
            "linger_ms": self.linger_ms,
            "max_batch_size": self.max_batch_size,
            "max_request_size": self.max_request_size,
            "compression_type": self.compression_type,
            "partitioner": self.partitioner or _DEFAULT_PARTITIONER,
            "request_timeout_ms": int(self.request_timeout * 1000),
            "metadata_max_age_ms": conf.producer_metadata_max_age_ms,
            "connections_max_idle_ms": conf.producer_connections_max_idle_ms,
            **credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
        }

    async def on_start(self) -> None:
        await super().on_start()  # Faust's send buffer
        settings = self.aiokafka_settings()
        kafka = aiokafka.AIOKafkaProducer(**settings)
        try:
            await kafka.start()
        except Exception as exc:
            # A broker refusing the idempotent producer's InitProducerId: aiokafka says only
            # `UnknownError()`; say which setting avoids it (`switchboard worker` checks this
            # before it starts; this covers a broker changed since, or a worker started in code).
            refusal = idempotence_refusal(exc, ",".join(settings["bootstrap_servers"]))
            if refusal is None or not self.idempotent:
                raise
            raise ConfigurationError(refusal) from exc
        self.kafka = kafka

    async def on_stop(self) -> None:
        kafka, self.kafka = self.kafka, None
        if kafka is not None:
            await kafka.stop()

    def running(self) -> aiokafka.AIOKafkaProducer:
        if self.kafka is None:
            raise ProducerSendError("the producer is not started")
        return self.kafka

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: HeadersArg | None,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        """Buffer a record; the returned future is the broker's acknowledgement."""
        if transactional_id:
            raise ProducerSendError("Switchboard's Kafka driver does not run Faust's transactions")
        kafka = self.running()
        if isinstance(headers, Mapping):
            headers = list(headers.items())
        timestamp_ms = int(timestamp * 1000.0) if timestamp else None
        try:
            delivery = await kafka.send(
                topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
            )
        except KafkaError as exc:
            raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        return cast(Awaitable[RecordMetadata], delivery)

    async def send_and_wait(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: HeadersArg | None,
        *,
        transactional_id: str | None = None,
    ) -> RecordMetadata:
        delivery = await self.send(topic, key, value, partition, timestamp, headers, transactional_id=transactional_id)
        return await delivery

    async def flush(self) -> None:
        await self.buffer.flush()
        if self.kafka is not None:
            await self.kafka.flush()

    def key_partition(self, topic: str, key: bytes) -> TP:
        kafka = self.running()
        cluster = kafka.client.cluster
        partitions = cluster.partitions_for_topic(topic)
        if not partitions:
            raise ProducerSendError(f"no partitions known for {topic}")
        available = cluster.available_partitions_for_topic(topic) or partitions
        partitioner = self.partitioner or _DEFAULT_PARTITIONER
        return TP(topic, partitioner(key, sorted(partitions), sorted(available)))

    def supports_headers(self) -> bool:
        return True  # record headers came with Kafka 0.11; aiokafka 0.14 needs brokers past it

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication: int,
        *,
        config: Mapping[str, Any] | None = None,
        timeout: Seconds = 20.0,
        retention: Seconds | None = None,
        compacting: bool | None = None,
        deleting: bool | None = None,
        ensure_created: bool = False,
    ) -> None:
        log.warning("not declaring %s: Switchboard declares its topics itself (`switchboard topics apply`)", topic)


class Transport(faust_base.Transport):
    """The driver registered as `switchboard://`."""

    Consumer: ClassVar[type[ConsumerT]] = SwitchboardConsumer
    Producer: ClassVar[type[ProducerT]] = Producer
    Fetcher: ClassVar[type[ServiceT]] = Fetcher
    default_port = DEFAULT_PORT
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
            return cast(int, _DEFAULT_PARTITIONER(key, all_partitions, available))
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
    "Fetcher",
    "KeyPartitioner",
    "Producer",
    "SwitchboardConsumer",
    "Transport",
    "broker_url",
]
