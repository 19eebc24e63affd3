"""The session stream stage: one resumable subscription per session with a turn in flight.

The worker that owns a conversation's partition (of `session.input`) holds the stream and produces
every server event, with its routing, to `session.events`. Redis keeps, per partition, the
sessions in flight and their cursors, so a new owner (after a rebalance or a crash) resumes them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pipeline import metrics
from pipeline.records import SessionEventRecord, now_ms
from pipeline.session import SessionClient
from pipeline.session.exceptions import NotFoundError, SessionAPIError
from pipeline.session.models import ServerEvent
from pipeline.session.previews import Preview
from pipeline.state import InflightStream, StateStore

from .outputs import Outputs

log = logging.getLogger(__name__)

# After these a stream is released: the turn is over (or waits on the chat), or the session is gone.
_TURN_END = frozenset({"session.status_idle", "session.status_terminated", "session.deleted"})


def raw_event(event: ServerEvent) -> dict[str, Any]:
    """The server event as JSON, verbatim for unknown types."""
    raw = getattr(event, "raw", None)
    if isinstance(raw, dict):
        return raw
    return event.model_dump(mode="json", exclude_none=True, by_alias=True)


class StreamRegistry:
    def __init__(
        self, state: StateStore, client: SessionClient, outputs: Outputs, *, reconnect_max: float = 5.0
    ) -> None:
        self.state = state
        self.client = client
        self.outputs = outputs
        self.reconnect_max = reconnect_max
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._partition_of: dict[str, int] = {}
        # A turn was started on a session whose stream is still open: do not release it at idle.
        self._extend: set[str] = set()
        self._owned: set[int] | None = None  # None: every partition (no rebalance info yet)

    @property
    def open_streams(self) -> int:
        return len(self._tasks)

    async def track(self, partition: int, stream: InflightStream) -> None:
        """Hold a stream for this session until its turn ends. Idempotent."""
        await self.state.add_inflight(partition, stream)
        if stream.session_id in self._tasks:
            self._extend.add(stream.session_id)
            return
        self._start(partition, stream)

    async def untrack(self, partition: int, session_id: str) -> None:
        task = self._tasks.pop(session_id, None)
        if task is not None:
            task.cancel()
        self._extend.discard(session_id)
        await self.state.remove_inflight(partition, session_id)

    async def on_partitions_assigned(self, partitions: set[int]) -> None:
        """The full new assignment (eager rebalance): drop streams we lost, resume the ones we got."""
        self._owned = set(partitions)
        for session_id, partition in list(self._partition_of.items()):
            if partition not in partitions:
                task = self._tasks.pop(session_id, None)
                self._partition_of.pop(session_id, None)
                if task is not None:
                    task.cancel()  # Redis keeps it: the new owner resumes from the cursor
        for partition in partitions:
            for stream in await self.state.inflight(partition):
                if stream.session_id not in self._tasks:
                    log.info("resuming stream of %s on partition %d", stream.session_id, partition)
                    self._start(partition, stream)
        metrics.STREAMS_OPEN.set(len(self._tasks))

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics.STREAMS_OPEN.set(0)

    def _start(self, partition: int, stream: InflightStream) -> None:
        self._partition_of[stream.session_id] = partition
        task = asyncio.create_task(self._run(partition, stream), name=f"stream:{stream.session_id}")
        self._tasks[stream.session_id] = task
        metrics.STREAMS_OPEN.set(len(self._tasks))

    async def _run(self, partition: int, stream: InflightStream) -> None:
        session_id = stream.session_id
        subscription = self.client.subscribe(session_id, after=stream.cursor, reconnect_max=self.reconnect_max)
        try:
            reconnects = 0
            async for event in subscription:
                if subscription.reconnects != reconnects:
                    metrics.STREAM_RECONNECTS.inc(subscription.reconnects - reconnects)
                    reconnects = subscription.reconnects
                if isinstance(event, Preview):
                    continue  # a preview: Switchboard shows only validated final replies (S13)
                await self._produce(stream, raw_event(event), event.type, event.id)
                if event.id:
                    await self.state.save_session_cursor(session_id, event.id)
                if event.type in _TURN_END:
                    if session_id in self._extend and event.type == "session.status_idle":
                        self._extend.discard(session_id)
                        continue
                    break
        except asyncio.CancelledError:
            raise
        except NotFoundError:
            # The session vanished without telling the stream: render treats it like a deletion.
            log.info("session %s not found while streaming", session_id)
            await self._produce(stream, {"type": "session.deleted", "id": None}, "session.deleted", None)
        except SessionAPIError as exc:
            log.warning("stream of %s failed: %s", session_id, type(exc).__name__)
            await self._produce(
                stream,
                {"type": "session.error", "error": {"type": "stream_failed", "message": type(exc).__name__,
                                                    "retry_status": {"type": "exhausted"}}},
                "session.error",
                None,
            )
            await self._produce(
                stream, {"type": "session.status_idle", "stop_reason": {"type": "retries_exhausted"}},
                "session.status_idle", None,
            )
        finally:
            if self._tasks.get(session_id) is asyncio.current_task():
                self._tasks.pop(session_id, None)
                self._partition_of.pop(session_id, None)
                self._extend.discard(session_id)
                metrics.STREAMS_OPEN.set(len(self._tasks))
        if session_id not in self._tasks:
            await self.state.remove_inflight(partition, session_id)

    async def _produce(self, stream: InflightStream, event: dict[str, Any], event_type: str, event_id: str | None) -> None:
        metrics.STREAM_EVENTS.labels(event_type).inc()
        await self.outputs.session_event(
            SessionEventRecord(
                conversation_key=stream.conversation_key,
                session_id=stream.session_id,
                event=event,
                event_type=event_type,
                event_id=event_id,
                trace_id=stream.trace_id,
                hops={"stream": now_ms()},
            )
        )
