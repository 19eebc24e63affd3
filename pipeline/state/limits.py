"""The inbound rate limits' Redis step (`pipeline.controls.limits` decides what is counted where):
per batch, one script call per bot with limits (`scripts/admit_turns.lua`), every key of one bot's
limits under the bot's hash tag, so each call runs on one node of a cluster."""

from __future__ import annotations

import asyncio

from pipeline.controls.limits import (
    ALLOWED,
    Counter,
    LimitDecision,
    LimitsConfig,
    TurnRequest,
    counters,
    message_windows,
    notice_ident,
)

from . import scripts
from .client import RedisClient
from .keys import Keys
from .models import ContextQuota

_ADMIT_TURNS = scripts.script("admit_turns")


class TurnLimiter:
    """The limits' Redis step: per batch, one script call per bot with limits."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    def _key(self, kind: str, bot: str, ident: str) -> str:
        return self.keys.scoped(kind, bot, f"{bot}:{ident}")

    async def admit(self, requests: list[tuple[str, LimitsConfig, TurnRequest]], now_ms: int) -> list[LimitDecision]:
        """Per request (`platform:bot`, the bot's limits, the message): may it start or join a turn?
        Exempt requests and bots without limits need no Redis."""
        decisions: list[LimitDecision] = [ALLOWED] * len(requests)
        by_bot: dict[str, list[int]] = {}
        for position, (bot, config, request) in enumerate(requests):
            if config.active and not request.exempt:
                by_bot.setdefault(bot, []).append(position)
        if not by_bot:
            return decisions
        replies = await asyncio.gather(
            *(self._call(bot, [requests[p] for p in positions], now_ms) for bot, positions in by_bot.items())
        )
        for positions, reply in zip(by_bot.values(), replies, strict=True):
            for position, one in zip(positions, reply, strict=True):
                decisions[position] = one
        return decisions

    async def _call(
        self, bot: str, requests: list[tuple[str, LimitsConfig, TurnRequest]], now_ms: int
    ) -> list[LimitDecision]:
        keys: list[str] = []
        args: list[str | int] = [len(requests)]
        per_request: list[list[Counter]] = []
        for _, config, request in requests:
            windows = counters(config, request, now_ms)
            per_request.append(windows)
            # A replay within the longest window gets the first answer again.
            args += [len(windows), max(c.window_ms for c in windows)]
            keys.append(self._key("inlimit-seen", bot, request.dedup_id))
            for counter in windows:
                args += [counter.limit, counter.window_ms]
                keys.append(self._key("inlimit", bot, counter.ident))
                keys.append(self._key("inlimit-notice", bot, notice_ident(counter, request)))
        raw = await self.redis.run_script(_ADMIT_TURNS, keys, args)
        decisions = []
        for windows, (allowed, over, notice, again) in zip(per_request, raw, strict=True):
            if int(allowed):
                decisions.append(ALLOWED)
            else:
                scope = windows[int(over) - 1].scope
                decisions.append(LimitDecision(False, scope, bool(int(notice)), again=bool(int(again))))
        return decisions


def context_quota(config: LimitsConfig, user_id: str, now_ms: int) -> ContextQuota | None:
    """What a group message may add to its chat's context window (`admit_inbound`'s quota)."""
    windows = message_windows(config, user_id, now_ms)
    if windows is None:
        return None
    chat, user = windows
    return ContextQuota(chat.ident, chat.limit, chat.window_ms, user.ident, user.limit, user.window_ms)
