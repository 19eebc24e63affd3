"""Where stages put what they produce. The app binds this to Faust topics; tests to a list.

Sends are buffered (Faust flushes the producer before it commits offsets). A stage that records a
fact in Redis after producing ("this turn end was handled", a stream cursor, an inbound id seen)
first waits for what it produced to be acknowledged by the broker (`delivered()`): otherwise a crash
could keep the fact and lose the records, and the replay would skip them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from pipeline import hopstamps, metrics
from pipeline.executor import defer
from pipeline.records import DeadLetter, OutboundMessage, SessionCommand, SessionEventRecord
from pipeline.topics import DEADLETTER, SESSION_EVENTS, SESSION_INPUT, outbound_topic

# The most of an original record a dead letter keeps: a longer one (an outbound message carrying
# inline media) keeps its first part, with its size and sha256; the whole original stays in its own
# topic at `topic`/`partition`/`offset` for as long as that topic keeps it (`switchboard deadletters
# replay` reads it from there).
DEAD_LETTER_RECORD_MAX_BYTES = 64 * 1024

# (topic, key, value) → buffered; returns an awaitable of the broker's acknowledgement (or None).
Send = Callable[[str, str | None, bytes], Awaitable[Any]]

# What the current task produced since `begin()`: each asyncio task has its own context.
_pending: ContextVar[list[Any] | None] = ContextVar("switchboard_outputs_pending", default=None)


class Outputs:
    def __init__(self, send: Send) -> None:
        self._send = send

    @staticmethod
    def begin() -> None:
        """Start tracking what this task produces (for `delivered()`)."""
        _pending.set([])

    @staticmethod
    async def delivered() -> None:
        """Wait until everything this task produced since `begin()` is acknowledged."""
        pending = _pending.get()
        if pending:
            waiting = [p for p in pending if p is not None]
            pending.clear()
            if waiting:
                await asyncio.gather(*waiting)

    @staticmethod
    async def delivered_outside_key() -> None:
        """As `delivered()`, but from a keyed work the wait runs after the work, outside its key's
        order (`pipeline.executor.defer`): the key's next work starts at once, and the record is
        acknowledged only once the broker has acknowledged what it produced. Only for a work that
        has nothing left to do after the wait."""
        pending = _pending.get()
        waiting = [p for p in pending or () if p is not None]
        if pending:
            pending.clear()
        if not waiting:
            return

        async def wait() -> None:
            await asyncio.gather(*waiting)

        if not defer(wait):
            await wait()

    async def _produce(self, topic: str, key: str | None, value: bytes) -> None:
        delivery = await self._send(topic, key, value)
        pending = _pending.get()
        if pending is not None and delivery is not None:
            pending.append(delivery)

    async def session_command(self, command: SessionCommand) -> None:
        if hopstamps.enabled:
            hopstamps.sent(command.hops, "dispatch")
        await self._produce(SESSION_INPUT, command.conversation_key, command.model_dump_json().encode())

    async def session_event(self, record: SessionEventRecord) -> None:
        if hopstamps.enabled:
            hopstamps.sent(record.hops, "render")
        await self._produce(SESSION_EVENTS, record.conversation_key, record.model_dump_json(exclude_none=True).encode())

    async def outbound(self, message: OutboundMessage) -> None:
        if hopstamps.enabled:
            hopstamps.sent(message.hops, "egress")
        await self._produce(
            outbound_topic(message.platform), message.conversation_key, message.model_dump_json().encode()
        )

    async def dead_letter(
        self,
        stage: str,
        reason: str,
        record: str,
        *,
        error: str = "",
        key: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        attempts: int = 1,
        record_bytes: int | None = None,
        record_sha256: str | None = None,
    ) -> None:
        metrics.DEAD_LETTERS.labels(stage, reason).inc()
        encoded = record.encode("utf-8", "replace")
        if len(encoded) > DEAD_LETTER_RECORD_MAX_BYTES and record_bytes is None:
            record_bytes, record_sha256 = len(encoded), hashlib.sha256(encoded).hexdigest()
            record = encoded[:DEAD_LETTER_RECORD_MAX_BYTES].decode("utf-8", "ignore")
        letter = DeadLetter(
            stage=stage,
            reason=reason,
            error=error[:2000],
            attempts=attempts,
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            record=record,
            record_bytes=record_bytes,
            record_sha256=record_sha256,
        )
        await self._produce(DEADLETTER, key, letter.model_dump_json().encode())
