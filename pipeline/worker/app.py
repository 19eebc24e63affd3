"""The worker: a Faust app on Switchboard's driver, with one stage per consumed topic.

Faust hosts the worker (lifecycle, signals, the consumer group's rebalances); Switchboard's driver
(`driver.py`) fetches, delivers fetched records to each topic's `StageRunner` in batches, commits
what the stages acknowledged, and produces. `WorkerService` opens the
runtime's resources after Faust starts and closes them after the stages stop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, cast

import faust
import mode
from faust.types import TP

from pipeline import hopstamps, metrics
from pipeline.errors import ConfigurationError
from pipeline.executor import KeyedExecutor, work_revoked
from pipeline.platforms.checks import check_bots
from pipeline.records import InboundMessage, OutboundMessage, SessionCommand, SessionEventRecord
from pipeline.runtime import Runtime
from pipeline.settings import Settings
from pipeline.state.exceptions import UNAVAILABLE
from pipeline.topics import IM_INBOUND, SESSION_EVENTS, SESSION_INPUT, outbound_topic

from . import collector
from .drain import Drain
from .driver import SCHEME, BatchSink, ConsumerTuning, KeyPartitioner, SwitchboardConsumer, Transport, broker_url
from .loopwatch import LoopWatch
from .stage import Stage, StageRunner

log = logging.getLogger(__name__)

ALL_STAGES = ("ingest", "dispatch", "render", "egress")
# Topics whose new records start turns: a draining worker stops reading them.
INTAKE_TOPICS = frozenset({IM_INBOUND, SESSION_INPUT})


class SwitchboardApp(faust.App):
    """A Faust app whose consumed topics each have a stage (a `BatchSink`) instead of an agent."""

    # Set by `create_app`: drain the turns in flight (on the first SIGTERM).
    drain: Callable[[], Awaitable[None]] | None = None
    # Set by `create_app`: the service that owns the runtime and serves the worker's HTTP surface.
    serving: type[mode.Service] | None = None
    # True once the first rebalance has ended: the stages' partitions are assigned, sought to their
    # committed offsets and fetched. Webhooks are served before (they need only the producer), but
    # a record produced then waits for the join (seconds), so readiness waits for this. It stays
    # true through later rebalances: every worker rebalances at once, and taking them all out of
    # the load balancer for it would refuse every webhook.
    consuming = False

    def __init__(
        self, id: str, *, consumer_tuning: ConsumerTuning, idempotent_producer: bool = True, **options: Any
    ) -> None:
        super().__init__(id, **options)
        self.consumer_tuning = consumer_tuning
        #: read by the driver's Producer (SWITCHBOARD_KAFKA_IDEMPOTENCE)
        self.idempotent_producer = idempotent_producer
        self._sinks: dict[str, BatchSink] = {}
        self._serving: mode.ServiceT | None = None

    async def on_started(self) -> None:
        # Faust starts `@app.service` services only once the consumer group's first rebalance has
        # completed, and a join can wait as long as the slowest member's revocation (or a killed
        # member's session timeout). Health, metrics and webhooks (which need only the producer)
        # would go unanswered all that while, so a supervisor's probe gives up on a worker that is
        # only joining. Serve as soon as the producer and the consumer are up; the stages get
        # records only after the rebalance, by then the runtime has started.
        if self.serving is not None and self._serving is None:
            self._serving = await self.on_init_extra_service(self.serving)
        await super().on_started()

    def on_rebalance_end(self) -> None:
        # Faust calls this once the flow is resumed and the fetcher runs ("Worker ready").
        super().on_rebalance_end()
        self.consuming = True

    def add_sink(self, topic: str, sink: BatchSink, *, partitions: int) -> None:
        """Subscribe to `topic` and deliver its records to `sink`."""
        self.topics.add(self.topic(topic, key_type=bytes, value_type=bytes, partitions=partitions))
        self._sinks[topic] = sink

    def sink_for(self, topic: str) -> BatchSink | None:
        return self._sinks.get(topic)

    @property
    def batch_consumer(self) -> SwitchboardConsumer:
        consumer = self.consumer
        assert isinstance(consumer, SwitchboardConsumer), "the app runs on Switchboard's driver"
        return consumer


def create_app(
    settings: Settings, *, stages: Iterable[str] = ALL_STAGES, platforms: Iterable[str] | None = None
) -> SwitchboardApp:
    required = {"SWITCHBOARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap, "SWITCHBOARD_REDIS_URL": settings.redis_url}
    missing = [name for name, value in required.items() if not value]
    if missing:
        raise ConfigurationError(f"{' and '.join(missing)} required for a worker")
    stage_set = set(stages)
    unknown = stage_set - set(ALL_STAGES)
    if unknown:
        raise ConfigurationError(f"unknown stages {sorted(unknown)}; known: {', '.join(ALL_STAGES)}")
    # What each platform asks of its bots (`switchboard worker` checked it with the settings; settings
    # made in code were not).
    check_bots(settings)
    platform_list = sorted(platforms) if platforms is not None else settings.platforms
    _check_driver_registered()
    collector.tune()
    hopstamps.enable(settings.hop_stamps)
    assert settings.kafka_bootstrap is not None
    app = SwitchboardApp(
        settings.app_id,
        consumer_tuning=ConsumerTuning(
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms, max_poll_records=settings.batch_max
        ),
        idempotent_producer=settings.kafka_idempotence,
        broker=broker_url(settings.kafka_bootstrap),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        datadir=_faust_datadir(settings.app_id),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_disable_leader=True,
        topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=0.5,
        broker_commit_every=1000,
        stream_wait_empty=False,  # no Faust streams: stages track their own work
        producer_linger_ms=settings.kafka_linger_ms,
        producer_max_batch_size=settings.kafka_max_batch_bytes,
        producer_partitioner=KeyPartitioner(),
        producer_acks=-1,
        broker_session_timeout=settings.kafka_session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, settings.kafka_session_timeout_seconds / 3),
        broker_rebalance_timeout=max(settings.kafka_session_timeout_seconds, 10.0),
    )
    runtime = Runtime(
        settings,
        send=_producer_send(app),
        produce_acked=_producer_send(app, acked=True),
        consuming=lambda: app.consuming,
    )
    app.switchboard_runtime = runtime  # type: ignore[attr-defined]
    executors: dict[str, KeyedExecutor] = {}

    def add(stage: Stage[Any]) -> None:
        executor = executors.get(stage.name)
        if executor is None:
            executor = executors[stage.name] = KeyedExecutor(settings.max_in_flight, name=stage.name)
        runner = StageRunner(stage, executor, runtime.outputs, lambda message: app.consumer.ack(message))
        app.add_sink(stage.topic, runner, partitions=settings.partitions)

    # The steps are looked up when called: the runtime builds the stages once Faust has started.
    if "ingest" in stage_set:
        add(Stage("ingest", IM_INBOUND, InboundMessage, lambda records, at: runtime.ingest.admit(records, at)))
    if "dispatch" in stage_set:
        add(Stage("dispatch", SESSION_INPUT, SessionCommand, lambda records, at: runtime.dispatch.admit(records, at)))
    if "render" in stage_set:
        add(Stage("render", SESSION_EVENTS, SessionEventRecord, lambda records, at: runtime.render.admit(records, at)))
    if "egress" in stage_set:
        for platform in platform_list:
            topic = outbound_topic(platform)
            add(Stage("egress", topic, OutboundMessage, lambda records, at: runtime.egress.admit(records, at)))

    owned: dict[str, set[int]] = {"session_input": set()}

    async def flush_now(command: SessionCommand, partition: int) -> None:
        """Render's flush, run by dispatch here in the conversation's order: a work of the
        `session.input` partition without an ack of its own (a rebalance that takes the partition
        drops it, and the new owner has the flush record). Left to the record when this worker
        does not own the partition (topics are co-partitioned: it does, but for a rebalance in
        between) or dispatch has too much pending (render must not wait for its room)."""
        executor = executors["dispatch"]
        if work_revoked() or partition not in owned["session_input"] or executor.pending >= executor.max_pending:
            return  # (render's own work revoked, or the partition between owners: the record's new owner)

        async def flush() -> None:
            try:
                await runtime.dispatch.handle(command, partition)
            except UNAVAILABLE as exc:  # not retried here: the flush record's handling is
                log.info("flush of %s left to its record: Redis unavailable (%s)", command.conversation_key, exc)

        await executor.submit(command.conversation_key, flush, partition=TP(SESSION_INPUT, partition))

    if {"dispatch", "render"} <= stage_set:
        runtime.flush_now = flush_now

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(app: faust.App, revoked: set[TP], **_: Any) -> None:
        metrics.PARTITIONS_ASSIGNED.set(0)  # until the rebalance assigns again
        owned["session_input"] -= {tp.partition for tp in revoked if tp.topic == SESSION_INPUT}
        # Work of revoked partitions no longer acknowledges: the new owner replays it.
        for executor in executors.values():
            executor.drop_partitions(set(revoked))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(app: faust.App, assigned: set[TP], **_: Any) -> None:
        metrics.PARTITIONS_ASSIGNED.set(len(assigned))
        # Streams of sessions in flight follow the conversation's partition of session.input.
        owned["session_input"] = {tp.partition for tp in assigned if tp.topic == SESSION_INPUT}
        if "dispatch" in stage_set and runtime.started:
            await runtime.streams.on_partitions_assigned(owned["session_input"])

    @app.timer(interval=2.0)
    async def export_gauges() -> None:
        for name, executor in executors.items():
            metrics.EXECUTOR_IN_FLIGHT.labels(name).set(executor.in_flight)
            metrics.EXECUTOR_PENDING.labels(name).set(executor.pending)
        lag.export(app)

    lag = _LagGauge()

    loop_watch = LoopWatch(dump_after=settings.loop_stall_dump_seconds)

    class WorkerService(mode.Service):
        """Opens the runtime's connections and the web server; closes them after the stages."""

        async def on_start(self) -> None:
            loop_watch.start()
            await runtime.start()
            if "dispatch" in stage_set:
                await runtime.streams.on_partitions_assigned(owned["session_input"])
            await runtime.start_web(settings.web_host, settings.web_port)
            # What lives now lives as long as the worker: the collector need not scan it again.
            gc.freeze()

        @mode.Service.timer(collector.FULL_COLLECTION_INTERVAL)
        async def _collect_cycles(self) -> None:
            collector.collect_cycles()

        async def on_stop(self) -> None:
            for executor in executors.values():
                await executor.close()
            await runtime.stop()
            await loop_watch.stop()

    def in_flight() -> Drain:
        return Drain(
            app.batch_consumer,
            INTAKE_TOPICS,
            busy=lambda: bool(runtime.streams.turns_in_flight or any(e.pending for e in executors.values())),
            quiet_seconds=max(0.5, 3 * settings.kafka_fetch_max_wait_ms / 1000),
        )

    async def drain() -> None:
        if not runtime.started:
            return
        await in_flight().run(settings.shutdown_drain_seconds)

    # Read at each scrape, so a test or the bench sees the state of that moment.
    metrics.WORKER_IDLE.set_function(lambda: float(runtime.started and in_flight().idle()))

    app.serving = WorkerService
    app.drain = drain
    return app


def _check_driver_registered() -> None:
    """Faust finds the driver through the package's `faust.transports` entry point, which exists
    only once the package is installed (an editable install from before the driver lacks it)."""
    try:
        found = faust.transport.by_url(f"{SCHEME}://")
    except ModuleNotFoundError:
        found = None
    if found is not Transport:
        raise ConfigurationError(
            "Switchboard's Kafka driver is not registered with Faust: install the package again "
            "(`pip install -e .`, or `make` after a change to pyproject.toml)"
        )


class _LagGauge:
    """Consumer lag per assigned partition: high watermark minus the committed offset. Label sets
    of partitions no longer assigned are removed, so a rebalance leaves no stale lag."""

    def __init__(self) -> None:
        self._labels: set[tuple[str, str]] = set()

    def export(self, app: SwitchboardApp) -> None:
        current: set[tuple[str, str]] = set()
        try:
            consumer = app.batch_consumer
            for tp in consumer.assignment():
                highwater = consumer.highwater(tp)
                committed = consumer.committed_offset(tp)
                if highwater is not None and committed is not None:
                    labels = (tp.topic, str(tp.partition))
                    metrics.CONSUMER_LAG.labels(*labels).set(max(0, highwater - committed))
                    current.add(labels)
        except Exception:  # before the first assignment, or during a rebalance
            log.debug("lag export skipped", exc_info=True)
            return
        for labels in self._labels - current:
            metrics.CONSUMER_LAG.remove(*labels)
        self._labels = current


def _faust_datadir(app_id: str) -> str:
    """Faust wants a directory for local tables (Switchboard keeps none). Its default is
    `<app id>-data` in the working directory, which litters checkouts and fails on a read-only
    root filesystem: `FAUST_DATADIR` when set (the image sets it), else one under the temp dir."""
    configured = os.environ.get("FAUST_DATADIR")
    if configured:
        return configured
    parent = Path(tempfile.gettempdir()) / "switchboard-faust"
    parent.mkdir(exist_ok=True)
    return str(parent / f"{app_id}-data")


def _producer_send(app: faust.App, *, acked: bool = False) -> Any:
    async def send(topic: str, key: str | None, value: bytes) -> Any:
        # Stages: buffered; the returned future is the broker's acknowledgement (see Outputs).
        # Ingress (`acked`): the webhook is answered only once the broker has the record.
        delivery = await app.producer.send(
            topic, key.encode() if key is not None else None, value, partition=None, timestamp=None, headers=None
        )
        if hopstamps.enabled:
            cast(asyncio.Future[Any], delivery).add_done_callback(hopstamps.ACKS.on_delivery)
        if acked:
            await delivery
            return None
        return delivery

    return send


__all__ = ["ALL_STAGES", "SwitchboardApp", "create_app"]
