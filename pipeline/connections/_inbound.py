"""Inbound frames of a held connection → `im.inbound`, done only once the broker has them.

A frame is parsed by the platform's own parser (the one its webhook uses, `Platform.parse`) and its
messages are produced in the order the frames came; `submit` returns once they are queued with the
producer, with an awaitable of the broker's acknowledgement, so a connection keeps reading while
earlier frames are being acknowledged and a transport with acknowledgements or offsets on the wire
gives them only after. A malformed frame is counted and dead-lettered (stage `ingress`) like a
malformed webhook.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline import metrics
from pipeline.platforms import Platform, WebhookRejected, WebhookRequest
from pipeline.records import now_ms
from pipeline.settings import BotConfig
from pipeline.stages.outputs import Outputs
from pipeline.topics import IM_INBOUND

from .base import FrameOutcome

log = logging.getLogger(__name__)

# (topic, key, value) → queued with the producer; returns an awaitable of the broker's
# acknowledgement (None when the send was already acknowledged).
Send = Callable[[str, str | None, bytes], Awaitable[Any]]

# Sends of one frame whose acknowledgement failed are tried again this many times (ingest drops
# the copies by message id).
_PRODUCE_ATTEMPTS = 3


class InboundSink:
    def __init__(self, send: Send, outputs: Outputs) -> None:
        self._send = send
        self._outputs = outputs

    async def submit(self, bot: BotConfig, platform: Platform, body: bytes) -> Awaitable[FrameOutcome]:
        received = now_ms()
        request = WebhookRequest(headers={}, body=body, received_at_ms=received)
        try:
            result = platform.parse(bot, request)
        except WebhookRejected as exc:
            await self._reject(bot, body, exc.reason, exc.detail)
            return _done(FrameOutcome(ignored=exc.reason))
        except Exception as exc:  # a parser bug: the frame is kept, the connection goes on
            log.exception("%s frame parser failed", bot.platform)
            await self._reject(bot, body, "parser_error", repr(exc))
            return _done(FrameOutcome(ignored="parser_error"))
        if not result.messages:
            metrics.CONNECTION_FRAMES.labels(bot.platform, result.ignored or "ignored").inc()
            return _done(FrameOutcome(ignored=result.ignored or "ignored"))
        records = [(m.conversation_key, m.model_dump_json().encode()) for m in result.messages]
        acks = [await self._send(IM_INBOUND, key, value) for key, value in records]
        return asyncio.ensure_future(self._acknowledged(bot, records, acks))

    async def _acknowledged(
        self, bot: BotConfig, records: list[tuple[str, bytes]], acks: list[Awaitable[Any] | None]
    ) -> FrameOutcome:
        for attempt in range(1, _PRODUCE_ATTEMPTS + 1):
            results = await asyncio.gather(*(a for a in acks if a is not None), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if not failed:
                break
            if attempt == _PRODUCE_ATTEMPTS:
                metrics.CONNECTION_FRAMES.labels(bot.platform, "produce_failed").inc()
                log.error("%s/%s: a frame could not be produced: %r", bot.platform, bot.bot_id, failed[0])
                raise failed[0]
            await asyncio.sleep(0.5 * attempt)
            acks = [await self._send(IM_INBOUND, key, value) for key, value in records]
        metrics.CONNECTION_FRAMES.labels(bot.platform, "produced").inc()
        metrics.INBOUND_ACCEPTED.labels(bot.platform).inc(len(records))
        return FrameOutcome(produced=len(records))

    async def _reject(self, bot: BotConfig, body: bytes, reason: str, detail: str) -> None:
        metrics.CONNECTION_FRAMES.labels(bot.platform, reason).inc()
        await self._outputs.dead_letter(
            "ingress",
            reason,
            body.decode("utf-8", "replace")[:100_000],
            error=detail[:500],
            key=f"{bot.platform}:{bot.bot_id}",
        )


def _done(outcome: FrameOutcome) -> Awaitable[FrameOutcome]:
    future: asyncio.Future[FrameOutcome] = asyncio.get_running_loop().create_future()
    future.set_result(outcome)
    return future
