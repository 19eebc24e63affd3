"""The worker: a Faust app whose agents are thin loops over the stage handlers.

Every agent runs with `concurrency=1` and hands each record to its stage's keyed executor; the
record is acknowledged (and so its offset may be committed) only when it and every earlier record
of its partition are done. Values are raw bytes parsed with pydantic (faster than Faust's codecs,
and the records are the contract in `pipeline/topics/`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import faust
import mode
from pydantic import BaseModel, ValidationError
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pipeline import faust_patches, metrics
from pipeline.executor import KeyedExecutor
from pipeline.records import InboundMessage, OutboundMessage, SessionCommand, SessionEventRecord
from pipeline.runtime import Runtime
from pipeline.settings import Settings
from pipeline.stages.render import RenderStage
from pipeline.topics import IM_INBOUND, SESSION_EVENTS, SESSION_INPUT, outbound_topic

log = logging.getLogger(__name__)

ALL_STAGES = ("ingest", "dispatch", "render", "egress")
Work = Callable[[], Awaitable[None]]
BatchAdmit = Callable[[list[Any]], Awaitable[list[Work | None]]]
# Failures of shared infrastructure that a retry outlives (a Redis restart, AOF loading).
_INFRASTRUCTURE_ERRORS = (RedisConnectionError, RedisTimeoutError, BusyLoadingError)


def create_app(
    settings: Settings, *, stages: Iterable[str] = ALL_STAGES, platforms: Iterable[str] | None = None
) -> faust.App:
    if not settings.kafka_bootstrap:
        raise ValueError("SWITCHBOARD_KAFKA_BOOTSTRAP is required for a worker")
    if not settings.redis_url:
        raise ValueError("SWITCHBOARD_REDIS_URL is required for a worker")
    stage_set = set(stages)
    unknown = stage_set - set(ALL_STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; known: {', '.join(ALL_STAGES)}")
    platform_list = sorted(platforms) if platforms is not None else settings.platforms
    faust_patches.apply()
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_disable_leader=True,
        topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=0.5,
        broker_commit_every=1000,
        stream_wait_empty=True,
        producer_linger_ms=settings.kafka_linger_ms,
        producer_acks=-1,
        broker_session_timeout=settings.kafka_session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, settings.kafka_session_timeout_seconds / 3),
        broker_rebalance_timeout=max(settings.kafka_session_timeout_seconds, 10.0),
    )
    app.switchboard_fetch_max_wait_ms = settings.kafka_fetch_max_wait_ms  # type: ignore[attr-defined]
    runtime = Runtime(settings, send=_producer_send(app), produce_acked=_producer_send(app, acked=True))
    app.switchboard_runtime = runtime  # type: ignore[attr-defined]

    executors: dict[str, KeyedExecutor] = {}

    def executor(stage: str) -> KeyedExecutor:
        if stage not in executors:
            executors[stage] = KeyedExecutor(settings.max_in_flight, name=stage)
        return executors[stage]

    async def run_handler(
        stage: str, handler: Callable[[Any, Any], Awaitable[None]], record: Any, message: Any, where: dict[str, Any]
    ) -> None:
        """Run a stage handler. Redis unavailable: wait and retry (handlers are idempotent), which
        holds the partition back instead of losing the record. Any other error: dead letter."""
        attempt = 0
        while True:
            try:
                await handler(record, message)
                return
            except _INFRASTRUCTURE_ERRORS as exc:
                attempt += 1
                metrics.HANDLER_RETRIES.labels(stage, type(exc).__name__).inc()
                log.warning("%s: Redis unavailable (%s); retry %d", stage, type(exc).__name__, attempt)
                await asyncio.sleep(min(5.0, 0.1 * 2**attempt))
            except Exception as exc:
                log.exception("%s: handler failed; dead-lettering the record", stage)
                await runtime.outputs.dead_letter(
                    stage,
                    "handler_error",
                    record.model_dump_json(),
                    error=repr(exc)[:2000],
                    key=getattr(record, "conversation_key", None),
                    **where,
                )
                return

    async def admit_with_retry(stage: str, admit: BatchAdmit, records: list[Any]) -> list[Work | None] | None:
        """A stage's batch step. Redis unavailable: wait and retry (it is idempotent). Any other
        error: None, and the batch is handled record by record (each with its own dead letter)."""
        attempt = 0
        while True:
            try:
                return await admit(records)
            except _INFRASTRUCTURE_ERRORS as exc:
                attempt += 1
                metrics.HANDLER_RETRIES.labels(stage, type(exc).__name__).inc()
                log.warning("%s: Redis unavailable (%s); retry %d", stage, type(exc).__name__, attempt)
                await asyncio.sleep(min(5.0, 0.1 * 2**attempt))
            except Exception:
                log.exception("%s: batch step failed; handling the records one by one", stage)
                return None

    def agent_loop(
        stage: str,
        topic_name: str,
        model: type[BaseModel],
        handler: Callable[[Any, Any], Awaitable[None]],
        inline: Callable[[Any], bool] | None = None,
        admit: BatchAdmit | None = None,
    ) -> None:
        """One agent per stage and topic. Records that are already fetched are taken together
        (up to `batch_max`), so a stage with a batch step (`admit`) pays one Redis round trip per
        batch; the records' remaining work goes to the keyed executor in offset order."""
        topic = app.topic(topic_name, key_type=bytes, value_type=bytes, partitions=settings.partitions)
        ex = executor(stage)

        async def handle_batch(manual: Any, events: list[Any]) -> None:
            parsed: list[tuple[Any, Any, dict[str, Any]]] = []
            for event in events:
                message = event.message
                where = {"topic": message.topic, "partition": message.partition, "offset": message.offset}
                raw = event.value
                try:
                    record = model.model_validate_json(raw)
                except ValidationError as exc:
                    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                    key = event.key.decode("utf-8", "replace") if isinstance(event.key, bytes) else None
                    await runtime.outputs.dead_letter(
                        stage, "invalid_record", text, error=str(exc)[:500], key=key, **where
                    )
                    record = None
                parsed.append((event, record, where))
            works: list[Work | None] | None = None
            if admit is not None:
                works = await admit_with_retry(stage, admit, [r for _, r, _ in parsed if r is not None])
            planned = iter(works) if works is not None else None
            for event, record, where in parsed:
                message = event.message
                slot = {"partition": (message.topic, message.partition), "offset": message.offset}
                ack = functools.partial(manual.ack, event)
                if record is None:
                    await ex.submit_done(**slot, ack=ack)
                    continue
                handle: Callable[[Any, Any], Awaitable[None]] = handler
                if planned is not None:
                    planned_work = next(planned)
                    if planned_work is None:
                        await ex.submit_done(**slot, ack=ack)
                        continue
                    handle = _planned(planned_work)
                elif inline is not None and inline(record):
                    await ex.submit_done(**slot, ack=ack)
                    continue
                work = functools.partial(run_handler, stage, handle, record, message, where)
                key = getattr(record, "conversation_key", None) or message.partition
                await ex.submit(key, work, **slot, ack=ack)

        async def loop(stream: Any) -> None:  # a faust.Stream (its StreamT protocol lacks noack)
            # The service opens Redis and the clients after Faust starts the agents: wait for it,
            # or the first records of a restart would meet a half-built runtime.
            await runtime.started_event.wait()
            manual = stream.noack()
            channel = manual.channel
            batch: list[Any] = []
            async for event in manual.events():
                batch.append(event)
                if len(batch) < settings.batch_max and not channel.empty():
                    continue  # more is already fetched: take it too
                events, batch = batch, []
                await handle_batch(manual, events)

        loop.__name__ = f"{stage}_{topic_name.replace('.', '_')}"
        app.agent(topic, name=loop.__name__, concurrency=1)(loop)

    if "ingest" in stage_set:
        agent_loop(
            "ingest",
            IM_INBOUND,
            InboundMessage,
            lambda r, m: runtime.ingest.handle(r),
            admit=lambda records: runtime.ingest.admit(records),
        )
    if "dispatch" in stage_set:
        agent_loop("dispatch", SESSION_INPUT, SessionCommand, lambda r, m: runtime.dispatch.handle(r, m.partition))
    if "render" in stage_set:
        agent_loop(
            "render",
            SESSION_EVENTS,
            SessionEventRecord,
            lambda r, m: runtime.render.handle(r),
            inline=RenderStage.handle_inline,
        )
    if "egress" in stage_set:
        for platform in platform_list:
            agent_loop(
                "egress",
                outbound_topic(platform),
                OutboundMessage,
                lambda r, m: runtime.egress.handle(r, topic=m.topic, partition=m.partition, offset=m.offset),
            )

    assignment: dict[str, set[int]] = {"session_input": set()}

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(app: faust.App, assigned: set[Any], **_: Any) -> None:
        # Streams of sessions in flight follow the conversation's partition of session.input.
        assignment["session_input"] = {tp.partition for tp in assigned if tp.topic == SESSION_INPUT}
        if "dispatch" in stage_set and runtime.started:
            await runtime.streams.on_partitions_assigned(assignment["session_input"])

    @app.timer(interval=2.0)
    async def export_gauges() -> None:
        for stage, ex in executors.items():
            metrics.EXECUTOR_IN_FLIGHT.labels(stage).set(ex.in_flight)
            metrics.EXECUTOR_PENDING.labels(stage).set(ex.pending)
        await runtime.export_lag(app)

    @app.service
    class SwitchboardService(mode.Service):
        """Opens the runtime's connections and the web server; closes them after the agents."""

        async def on_start(self) -> None:
            await runtime.start()
            if "dispatch" in stage_set:
                await runtime.streams.on_partitions_assigned(assignment["session_input"])
            await runtime.start_web(settings.web_host, settings.web_port)

        async def on_stop(self) -> None:
            for ex in executors.values():
                await ex.close()
            await runtime.stop()

    async def drain(seconds: float) -> None:
        """Before Faust stops (its fetcher stops first): take no new turns and let the running ones
        finish through render and egress, for at most `seconds`; the rest resumes elsewhere."""
        if seconds <= 0 or not runtime.started:
            return
        consumer = app.consumer
        with contextlib.suppress(Exception):
            consumer.pause_partitions({tp for tp in consumer.assignment() if tp.topic in (IM_INBOUND, SESSION_INPUT)})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        # A turn's last records travel through the broker between stages (idle → render → egress),
        # where no executor or stream sees them: "quiet" must outlast a few fetch round trips, and
        # the downstream partitions we own must have nothing left to read.
        quiet_for = max(0.5, 3 * settings.kafka_fetch_max_wait_ms / 1000)
        quiet_since: float | None = None
        while loop.time() < deadline:
            busy = (
                runtime.streams.turns_in_flight
                or any(ex.pending for ex in executors.values())
                or _unread_downstream(consumer)
            )
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= quiet_for:  # nothing in flight for a while: done
                log.info("drained: no turn in flight")
                return
            await asyncio.sleep(0.1)
        log.warning(
            "drain time over with %d turn(s) in flight; they resume on the next owner", runtime.streams.turns_in_flight
        )

    app.switchboard_drain = drain  # type: ignore[attr-defined]
    app.switchboard_drain_seconds = settings.shutdown_drain_seconds  # type: ignore[attr-defined]
    return app


class DrainingWorker(faust.Worker):
    """A Faust worker whose first SIGTERM drains the turns in flight before shutting down (a
    second SIGTERM, or SIGINT, stops at once)."""

    _draining = False
    _drain_task: asyncio.Future[None] | None = None

    def _on_sigterm(self) -> None:
        drain = getattr(self.app, "switchboard_drain", None)
        if self._draining or drain is None:
            super()._on_sigterm()
            return
        self._draining = True
        seconds = getattr(self.app, "switchboard_drain_seconds", 0.0)

        async def drain_then_stop() -> None:
            try:
                await drain(seconds)
            finally:
                super(DrainingWorker, self)._on_sigterm()

        self._drain_task = asyncio.ensure_future(drain_then_stop(), loop=self.loop)


def _unread_downstream(consumer: Any) -> bool:
    """Records waiting in our partitions of the topics after dispatch (as far as the last fetch
    responses tell: their high watermarks against what was read)."""
    try:
        for tp in consumer.assignment():
            if tp.topic in (IM_INBOUND, SESSION_INPUT):
                continue
            highwater = consumer.highwater(tp)
            read = consumer._read_offset.get(tp)  # None: nothing read here yet (the quiet time covers it)
            if highwater is not None and read is not None and highwater > read + 1:
                return True
    except Exception:  # during a rebalance: nothing to tell
        log.debug("downstream check skipped", exc_info=True)
    return False


def _planned(work: Work) -> Callable[[Any, Any], Awaitable[None]]:
    """A batch step's remaining work in the shape of a record handler."""

    async def handle(record: Any, message: Any) -> None:
        await work()

    return handle


def _producer_send(app: faust.App, *, acked: bool = False) -> Callable[[str, str | None, bytes], Awaitable[Any]]:
    async def send(topic: str, key: str | None, value: bytes) -> Any:
        # Stages: buffered; the returned future is the broker's acknowledgement (see Outputs).
        # Ingress (`acked`): the webhook is answered only once the broker has the record.
        delivery = await app.producer.send(
            topic, key.encode() if key is not None else None, value, partition=None, timestamp=None, headers=None
        )
        if acked:
            await delivery
            return None
        return delivery

    return send
