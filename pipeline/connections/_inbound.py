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
from pipeline.stages.refused_early import EarlyRefusals
from pipeline.topics import IM_INBOUND

from .base import FrameOutcome

log = logging.getLogger(__name__)

# (topic, key, value) → queued with the producer; returns an awaitable of the broker's
# acknowledgement (None when the send was already acknowledged).
Send = Callable[[str, str | None, bytes], Awaitable[Any]]

# Backoff between sends of a frame whose acknowledgement failed (ingest drops copies by message id).
_RETRY_FIRST = 0.5
_RETRY_CAP = 5.0


class InboundSink:
    def __init__(
        self, send: Send, outputs: Outputs, *, patience: float = 30.0, refusals: EarlyRefusals | None = None
    ) -> None:
        self._send = send
        self._outputs = outputs
        self._patience = patience  # seconds a frame's produce is retried before it is given up
        # The triggers the workers' ingest found over a limit: dropped here (none by default).
        self._refusals = refusals if refusals is not None else EarlyRefusals()

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
        messages = self._refusals.screen(bot, result.messages)
        if not messages:
            metrics.CONNECTION_FRAMES.labels(bot.platform, "rate_limited").inc()
            return _done(FrameOutcome(ignored="rate_limited"))
        records = [(m.conversation_key, m.model_dump_json().encode()) for m in messages]
        acks = [await self._send(IM_INBOUND, key, value) for key, value in records]
        return asyncio.ensure_future(self._acknowledged(bot, records, acks))

    async def _acknowledged(
        self, bot: BotConfig, records: list[tuple[str, bytes]], acks: list[Awaitable[Any] | None]
    ) -> FrameOutcome:
        # A leader election or a broker restart outlasts the producer's own retries: the frame is
        # sent again until `patience` runs out. OneBot acknowledges nothing, so giving up loses it.
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._patience
        delay = _RETRY_FIRST
        while True:
            results = await asyncio.gather(*(a for a in acks if a is not None), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if not failed:
                break
            if loop.time() + delay > give_up_at:
                metrics.CONNECTION_FRAMES.labels(bot.platform, "produce_failed").inc()
                log.error("%s/%s: a frame could not be produced: %r", bot.platform, bot.bot_id, failed[0])
                raise failed[0]
            metrics.CONNECTION_FRAMES.labels(bot.platform, "produce_retried").inc()
            log.warning("%s/%s: producing a frame failed (%r); sent again", bot.platform, bot.bot_id, failed[0])
            await asyncio.sleep(delay)
            delay = min(_RETRY_CAP, delay * 2)
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
