"""Egress: `im.outbound.<platform>` → the platform's API.

Checks every message for secrets first (`LeakGuard`: the one check all outbound messages pass),
renders neutral segments into the platform's calls, waits for the per-chat and per-bot rate limits
(shared by all workers through Redis), sends, honours `retry_after`, retries transient failures
with backoff and full jitter, and dead-letters what still fails or fails for good. A delivered
outbound id (and each delivered call of it) is recorded, so a replay never sends it twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable

import httpx

from pipeline import metrics
from pipeline.platforms import MediaLoader, Platform, SendOutcome, get_platform
from pipeline.records import OutboundMessage, Position, conversation_key, join_ids, now_ms
from pipeline.segments import LeakScanner
from pipeline.settings import BotConfig, Settings
from pipeline.state import DeliveryStore, RateWindow

from .leakguard import LeakGuard
from .notify import Notifier
from .outputs import Outputs

log = logging.getLogger(__name__)
# One INFO line per delivered message (conversation key, kind, time since the inbound message that
# started its turn; never the text): what `switchboard up` shows in its terminal. Said as "after the
# message", not "after the webhook": the message may have come over a WebSocket or the console, and
# after a confirmation the time includes the wait for its answer.
turns_log = logging.getLogger("pipeline.turns")

Work = Callable[[], Awaitable[None]]


def backoff_delay(attempt: int, *, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base·2^attempt))."""
    return (rng or random).uniform(0, min(cap, base * (2**attempt)))


class EgressStage:
    def __init__(
        self,
        settings: Settings,
        deliveries: DeliveryStore,
        outputs: Outputs,
        http: httpx.AsyncClient,
        load_media: MediaLoader,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        platform_for: Callable[[str], Platform] = get_platform,
        leak_guard: LeakGuard | None = None,
    ) -> None:
        self.settings = settings
        self.deliveries = deliveries
        self.outputs = outputs
        self.http = http
        self.load_media = load_media
        self.sleep = sleep
        self.platform_for = platform_for
        # Without a guard given, credential shapes are still caught (no configured secrets known).
        self.leak_guard = leak_guard or LeakGuard(LeakScanner(), Notifier(settings))

    async def admit(self, messages: list[OutboundMessage], positions: list[Position]) -> list[Work | None]:
        """The batch step: each message is sent in its conversation's turn."""
        return [
            functools.partial(self.handle, m, topic=p.topic, partition=p.partition, offset=p.offset)
            for m, p in zip(messages, positions, strict=True)
        ]

    async def handle(self, message: OutboundMessage, *, topic: str, partition: int, offset: int) -> None:
        platform_name = message.platform
        bot = self.settings.bot(platform_name, message.bot_id)
        if bot is None:
            await self._dead(message, "unknown_bot", "", topic, partition, offset, 0)
            return
        platform = self.platform_for(platform_name)
        message = self.leak_guard.check(bot, message)
        try:
            calls = platform.render(bot, message)
        except Exception as exc:  # a renderer bug must not stop the partition
            log.exception("render for %s failed", platform_name)
            await self._dead(message, "render_failed", repr(exc), topic, partition, offset, 0)
            return
        windows = self._rate_windows(bot, platform, message)
        if platform.profile.delivers_once:
            # The platform itself posts at most once per outbound id (the console): no markers.
            for call in calls:
                outcome, attempts = await self._send_with_retries(bot, platform, message, call, windows)
                if outcome.status != "delivered":
                    await self._dead(
                        message, outcome.reason or outcome.status, outcome.detail, topic, partition, offset, attempts
                    )
                    return
        else:
            # One round trip tells what a replay already delivered (the message, or some of its
            # calls) and takes the first call's rate slots.
            call_ids = [f"{message.outbound_id}:{i}" for i in range(len(calls))]
            claim = await self.deliveries.claim(_scope(bot), [message.outbound_id, *call_ids], windows if calls else ())
            if claim.delivered[0] is not None:
                metrics.EGRESS.labels(platform_name, "duplicate").inc()
                return
            slot_taken = claim.wait == 0
            for index, call in enumerate(calls):
                if claim.delivered[index + 1] is not None:
                    continue  # sent before a crash; do not send again
                outcome, attempts = await self._send_with_retries(
                    bot, platform, message, call, windows, slot_taken=slot_taken
                )
                slot_taken = False
                if outcome.status != "delivered":
                    await self._dead(
                        message, outcome.reason or outcome.status, outcome.detail, topic, partition, offset, attempts
                    )
                    return
                last = index == len(calls) - 1
                await self.deliveries.mark_delivered(
                    _scope(bot), [call_ids[index], message.outbound_id] if last else [call_ids[index]]
                )
            if not calls:
                await self.deliveries.mark_delivered(_scope(bot), [message.outbound_id])
        metrics.EGRESS.labels(platform_name, "sent").inc()
        self._observe(message)
        if turns_log.isEnabledFor(logging.INFO):
            ingress = message.hops.get("ingress")
            since = f"{now_ms() - ingress:.0f} ms after the message" if ingress is not None else "no message time"
            if "replay" in message.hops:
                since += ", replayed"
            turns_log.info("%s: %s delivered, %s", message.conversation_key, message.kind, since)

    async def _send_with_retries(
        self,
        bot: BotConfig,
        platform: Platform,
        message: OutboundMessage,
        call: object,
        windows: list[RateWindow],
        *,
        slot_taken: bool = False,
    ) -> tuple[SendOutcome, int]:
        attempt = 0
        while True:
            if not slot_taken:
                await self._wait_for_rate(bot, windows)
            slot_taken = False
            outcome = await platform.send(bot, call, self.http, self.load_media)  # type: ignore[arg-type]
            attempt += 1
            if outcome.status != "retry":
                return outcome, attempt
            if attempt >= self.settings.egress_max_attempts:
                return SendOutcome(
                    "permanent", reason=outcome.reason or "retries_exhausted", detail=outcome.detail
                ), attempt
            if outcome.retry_after is not None:
                metrics.EGRESS.labels(message.platform, "rate_limited").inc()
                delay = outcome.retry_after
            else:
                metrics.EGRESS.labels(message.platform, "retried").inc()
                delay = backoff_delay(attempt - 1)
            await self.sleep(delay)

    @staticmethod
    def _rate_windows(bot: BotConfig, platform: Platform, message: OutboundMessage) -> list[RateWindow]:
        """The bot's limits per chat and per bot (the platform's documented ones by default)."""
        windows = []
        chat_limit = bot.rate_limit_chat or platform.profile.default_chat_limit
        bot_limit = bot.rate_limit_bot or platform.profile.default_bot_limit
        if chat_limit is not None:
            identifier = conversation_key(bot.platform, bot.bot_id, message.chat_id)
            windows.append(RateWindow(identifier, chat_limit.count, chat_limit.per_seconds))
        if bot_limit is not None:
            windows.append(RateWindow(join_ids(bot.platform, bot.bot_id), bot_limit.count, bot_limit.per_seconds))
        return windows

    async def _wait_for_rate(self, bot: BotConfig, windows: list[RateWindow]) -> None:
        """Take a slot in every window (shared by all workers), waiting as long as they say."""
        if not windows:
            return
        while True:
            wait = (await self.deliveries.claim(_scope(bot), (), windows)).wait
            if wait <= 0:
                return
            await self.sleep(min(wait, 5.0))

    async def _dead(
        self, message: OutboundMessage, reason: str, detail: str, topic: str, partition: int, offset: int, attempts: int
    ) -> None:
        metrics.EGRESS.labels(message.platform, "dead_lettered").inc()
        log.warning("outbound %s dead-lettered: %s", message.outbound_id, reason)
        await self.outputs.dead_letter(
            "egress",
            reason,
            message.model_dump_json(),
            error=detail,
            key=message.conversation_key,
            topic=topic,
            partition=partition,
            offset=offset,
            attempts=attempts,
        )

    @staticmethod
    def _observe(message: OutboundMessage) -> None:
        # A replayed reply's hops go back to its first delivery attempt: not this pipeline's latency.
        if message.kind != "reply" or "replay" in message.hops:
            return
        now = now_ms()
        hops = message.hops
        ingress = hops.get("ingress")
        if ingress is None:
            return
        total = max(0.0, (now - ingress) / 1000.0)
        metrics.END_TO_END.labels(message.platform).observe(total)
        dispatched, streamed = hops.get("dispatch"), hops.get("stream")
        if dispatched is not None and streamed is not None:
            agent = max(0.0, (streamed - dispatched) / 1000.0)
            metrics.PIPELINE_OVERHEAD.labels(message.platform).observe(max(0.0, total - agent))
        metrics.observe_hop("egress", hops, "render", now)


def _scope(bot: BotConfig) -> str:
    """What a bot's delivered markers and rate windows belong to (one slot on a Redis Cluster)."""
    return join_ids(bot.platform, bot.bot_id)
