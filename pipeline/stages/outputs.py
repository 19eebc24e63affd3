"""Where stages put what they produce. The app binds this to Faust topics; tests to a list."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pipeline import metrics
from pipeline.records import DeadLetter, OutboundMessage, SessionCommand, SessionEventRecord
from pipeline.topics import DEADLETTER, SESSION_EVENTS, SESSION_INPUT, outbound_topic

# (topic, key, value) → produced (awaited until the producer accepted it).
Send = Callable[[str, str | None, bytes], Awaitable[None]]


class Outputs:
    def __init__(self, send: Send) -> None:
        self._send = send

    async def session_command(self, command: SessionCommand) -> None:
        await self._send(SESSION_INPUT, command.conversation_key, command.model_dump_json().encode())

    async def session_event(self, record: SessionEventRecord) -> None:
        await self._send(SESSION_EVENTS, record.conversation_key, record.model_dump_json().encode())

    async def outbound(self, message: OutboundMessage) -> None:
        await self._send(outbound_topic(message.platform), message.conversation_key, message.model_dump_json().encode())

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
    ) -> None:
        metrics.DEAD_LETTERS.labels(stage, reason).inc()
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
        )
        await self._send(DEADLETTER, key, letter.model_dump_json().encode())
