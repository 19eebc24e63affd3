"""The session stream stage: one resumable subscription per session with a turn in flight.

The worker that owns a conversation's partition (of `session.input`) holds the stream and produces
every server event, with its routing, to `session.events`. Redis keeps, per partition, the
sessions in flight and their cursors, so a new owner (after a rebalance or a crash) resumes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pipeline import metrics
from pipeline.records import FORWARDED_EVENT_TYPES, ForwardedEvent, SessionEventRecord, now_ms
from pipeline.session import SessionClient
from pipeline.session.exceptions import NotFoundError, SessionAPIError
from pipeline.session.models import (
    AgentMessage,
    RetriesExhausted,
    RetryStatus,
    ServerEvent,
    SessionDeleted,
    SessionError,
    SessionErrorDetail,
    SessionStatusIdle,
    SessionStatusTerminated,
    SessionUsage,
    UnknownEvent,
    UnknownStopReason,
    UnparsedEvent,
)
from pipeline.session.previews import Preview
from pipeline.state import InflightStream, StreamStore
from pipeline.state.retry import while_unavailable

from .outputs import Outputs

log = logging.getLogger(__name__)

# After these a stream is released: the turn is over (or waits on the chat), or the session is gone.
_TERMINAL = frozenset({"session.status_terminated", "session.deleted"})
_TURN_END = frozenset({"session.status_idle", *_TERMINAL})
# What render acts on (`ForwardedEvent`); the rest of a turn's events (status, spans, thinking, tool
# results, thread events, the user's own events) stay out of Kafka: ten records per turn become
# two (the reply and the idle, in one produce), three for a bot with usage budgets (its usage).
FORWARDED = FORWARDED_EVENT_TYPES


# Parsed in full on the stream: what is forwarded, and what its metrics read. The rest of a turn's
# events are read for their type and id only (see `UnparsedEvent`).
PARSED = FORWARDED | {"span.model_request_end"}


def forwardable(event: ServerEvent | UnparsedEvent) -> ForwardedEvent | None:
    """The event as render takes it, or None when render has nothing to do with it. A known type
    the server sent malformed (the client keeps it as an `UnknownEvent`) still ends its turn: an
    idle with a stop reason nobody can read, an error of an unknown kind."""
    if event.type not in FORWARDED or isinstance(event, UnparsedEvent):
        return None
    if not isinstance(event, UnknownEvent):
        return cast(ForwardedEvent, event)
    log.warning("session server sent a malformed %s event; handled as an unreadable one", event.type)
    if event.type == "session.status_idle":
        return SessionStatusIdle(id=event.id, stop_reason=UnknownStopReason(raw={"type": "malformed"}))
    if event.type == "session.error":
        malformed = SessionErrorDetail(type="malformed", retry_status=RetryStatus(type="malformed"))
        return SessionError(id=event.id, error=malformed)
    if event.type == "session.status_terminated":
        return SessionStatusTerminated(id=event.id)
    if event.type == "session.deleted":
        return SessionDeleted(id=event.id)
    return None  # a malformed message or tool call: nothing render could act on


def observe_unforwarded(event: ServerEvent | UnparsedEvent) -> None:
    """Metrics of the events not forwarded: tokens per model request."""
    if event.type == "span.model_request_end":
        usage = getattr(event, "model_usage", None)
        if usage is None:
            return
        for kind in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            value = getattr(usage, kind, None)
            if isinstance(value, int) and value > 0:
                metrics.TOKENS.labels(kind).inc(value)


@dataclass(eq=False)
class _HeldStream:
    partition: int
    stream: InflightStream
    task: asyncio.Task[None] | None = None
    # Between turns the stream lingers (a chatty conversation skips the reopen and history read).
    lingering: bool = False
    # Turns started while one was still running (busy policy `interrupt`): their idles are awaited too.
    queued_turns: int = 0


class StreamRegistry:
    def __init__(
        self,
        state: StreamStore,
        client: SessionClient,
        outputs: Outputs,
        *,
        reconnect_max: float = 5.0,
        linger_seconds: float = 20.0,
        accounts_usage: Callable[[str], bool] = lambda conversation: True,
    ) -> None:
        self.state = state
        self.client = client
        self.outputs = outputs
        self.reconnect_max = reconnect_max
        self.linger_seconds = linger_seconds
        # Whether a conversation's bot keeps usage budgets: only then does render need the turn's
        # `session.usage` (for every other bot it would be a record per turn read for nothing).
        self.accounts_usage = accounts_usage
        self._held: dict[str, _HeldStream] = {}
        self._resuming: asyncio.Task[None] | None = None

    @property
    def open_streams(self) -> int:
        return len(self._held)

    @property
    def turns_in_flight(self) -> int:
        """Streams carrying a turn now (not those lingering between turns)."""
        return sum(1 for held in self._held.values() if not held.lingering)

    async def track(self, partition: int, stream: InflightStream, *, registered: bool = False) -> None:
        """Hold a stream for this session until its turn ends. `registered`: the caller already
        recorded it in flight in Redis (dispatch does so with the turn's state, in one round trip)."""
        if not registered:
            await self.state.add_inflight(partition, stream)
        held = self._held.get(stream.session_id)
        if held is not None and held.task is not None and not held.task.done():
            # The same turn tracked again: a send a crash cut short, sent by the partition's new
            # owner, whose stream was already resumed from the turn's in-flight entry. Counting it
            # as a second turn would wait for an idle that never comes (a turn in flight for ever).
            same_turn = stream.trace_id is not None and held.stream.trace_id == stream.trace_id
            held.stream.trace_id = stream.trace_id
            if held.lingering:
                held.lingering = False  # the open stream carries the new turn; no history read needed
            elif not same_turn:
                held.queued_turns += 1
            return
        self._start(partition, stream)

    async def untrack(self, partition: int, session_id: str, conversation: str) -> None:
        held = self._held.pop(session_id, None)
        if held is not None and held.task is not None:
            held.task.cancel()
        await self.state.remove_inflight(partition, session_id, conversation)

    async def on_partitions_assigned(self, partitions: set[int]) -> None:
        """The full new assignment (eager rebalance): drop the streams we lost now; resume the ones
        we got in the background. Reading them retries while Redis is unavailable (a restart, a
        Cluster failover): a Redis error inside the rebalance callback would crash the worker."""
        for session_id, held in list(self._held.items()):
            if held.partition not in partitions:
                self._held.pop(session_id, None)
                if held.task is not None:
                    held.task.cancel()  # Redis keeps it: the new owner resumes from the cursor
        metrics.STREAMS_OPEN.set(len(self._held))
        if self._resuming is not None:
            self._resuming.cancel()  # an older assignment's: the new one is read in full
        self._resuming = asyncio.create_task(self._resume(sorted(partitions)), name="streams:resume")

    async def resumed(self) -> None:
        """Wait until the streams of the last assignment are resumed (or it was superseded)."""
        if self._resuming is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._resuming)

    async def _resume(self, partitions: list[int]) -> None:
        try:
            await self._resume_partitions(partitions)
        except Exception:  # not Redis away: a bug, logged; the next assignment reads them again
            log.exception("streams: resuming the streams of partitions %s failed", partitions)

    async def _resume_partitions(self, partitions: list[int]) -> None:
        for partition in partitions:
            streams = await while_unavailable(
                functools.partial(self.state.inflight, partition),
                stage="streams",
                doing=f"resuming partition {partition}",
            )
            for stream in streams:
                if stream.session_id not in self._held:
                    log.info("resuming stream of %s on partition %d", stream.session_id, partition)
                    self._start(partition, stream)

    async def close(self) -> None:
        if self._resuming is not None:
            self._resuming.cancel()
        tasks = [h.task for h in self._held.values() if h.task is not None]
        self._held.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics.STREAMS_OPEN.set(0)

    def _start(self, partition: int, stream: InflightStream) -> None:
        held = _HeldStream(partition=partition, stream=stream)
        held.task = asyncio.create_task(self._run(held), name=f"stream:{stream.session_id}")
        self._held[stream.session_id] = held
        metrics.STREAMS_OPEN.set(len(self._held))

    async def _run(self, held: _HeldStream) -> None:
        stream = held.stream
        session_id = stream.session_id
        subscription = self.client.subscribe(
            session_id, after=stream.cursor, reconnect_max=self.reconnect_max, parse=PARSED
        )
        events = subscription.__aiter__()
        next_event: asyncio.Future[Any] | None = None
        reconnects = 0
        forwards_usage = self.accounts_usage(stream.conversation_key)
        # Render acts on an agent.message only with the event after it (the turn's end shows it as
        # the reply, a tool call as progress), so it waits here for that event and both go to the
        # broker in one batch: render then reads them together and writes no state for the message
        # alone. Nothing is late for it: render could not have acted earlier.
        messages: list[ForwardedEvent] = []
        try:
            while True:
                if next_event is None and not held.lingering:
                    # A turn runs: the next event is read in place (no task or timer per event).
                    event = await events.__anext__()
                else:
                    # Between turns a read has a deadline, and a turn may start while it waits.
                    if next_event is None:
                        next_event = asyncio.ensure_future(events.__anext__())
                    done, _ = await asyncio.wait({next_event}, timeout=self.linger_seconds if held.lingering else None)
                    if not done:
                        if held.lingering:
                            break  # nothing for a while after the turn: release the stream
                        continue  # a turn started while we waited: keep the same pending read
                    event = next_event.result()
                    next_event = None
                if subscription.reconnects != reconnects:
                    metrics.STREAM_RECONNECTS.inc(subscription.reconnects - reconnects)
                    reconnects = subscription.reconnects
                if isinstance(event, Preview):
                    continue  # Switchboard shows only validated final replies (S13)
                held.lingering = False
                forwarded = forwardable(event)
                if forwarded is None:
                    observe_unforwarded(event)
                    continue
                metrics.STREAM_EVENTS.labels(event.type).inc()
                if isinstance(forwarded, AgentMessage | SessionUsage):
                    # The usage comes just before its idle (P9): both go in one produce too.
                    if forwards_usage or isinstance(forwarded, AgentMessage):
                        messages.append(forwarded)
                    continue
                terminal = event.type in _TERMINAL
                if terminal:
                    self.outputs.begin()  # released below only once the broker has the event
                await self._produce(stream, *messages, forwarded)
                messages.clear()
                if terminal:
                    await self.outputs.delivered()
                    await self.state.remove_inflight(held.partition, session_id, held.stream.conversation_key)
                    held.lingering = True  # released
                    break  # nothing more will come
                if event.type != "session.status_idle":
                    continue
                # Render saves the cursor (the idle's id) and releases the in-flight entry once it
                # has handled the turn's end: a resume replays at most this turn's events, which
                # render and egress de-duplicate by their ids.
                if held.queued_turns:
                    held.queued_turns -= 1
                    continue
                held.lingering = True
        except StopAsyncIteration:
            pass
        except asyncio.CancelledError:
            raise
        except NotFoundError:
            # The session vanished without telling the stream: render treats it like a deletion.
            log.info("session %s not found while streaming", session_id)
            await self._produce(stream, *messages, SessionDeleted())
        except SessionAPIError as exc:
            log.warning("stream of %s failed: %s", session_id, type(exc).__name__)
            failure = SessionErrorDetail(
                type="stream_failed", message=type(exc).__name__, retry_status=RetryStatus(type="exhausted")
            )
            await self._produce(
                stream, *messages, SessionError(error=failure), SessionStatusIdle(stop_reason=RetriesExhausted())
            )
        finally:
            if next_event is not None and not next_event.done():
                next_event.cancel()
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
            if self._held.get(session_id) is held:
                del self._held[session_id]
                metrics.STREAMS_OPEN.set(len(self._held))
                if not held.lingering:
                    await self.state.remove_inflight(held.partition, session_id, held.stream.conversation_key)

    async def _produce(self, stream: InflightStream, *events: ForwardedEvent) -> None:
        """The events in order, with no wait in between: the producer batches them together."""
        stamp = now_ms()
        for event in events:
            await self.outputs.session_event(
                SessionEventRecord(
                    conversation_key=stream.conversation_key,
                    session_id=stream.session_id,
                    event=event,
                    trace_id=stream.trace_id,
                    hops={"stream": stamp},
                )
            )
