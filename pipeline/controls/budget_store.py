"""Usage budgets in Redis: the windows' totals per bot, chat and user, the last cumulative value
accounted per session, grants, and the notice markers. Every key of a bot hashes to the bot's slot
on a Redis Cluster, so the accounting script runs on one node.
"""

from __future__ import annotations

from importlib import resources

from pipeline.state.client import RedisClient, Script
from pipeline.state.keys import Keys

from .budgets import Counted, Grant, Scope, Spent, Totals, Window

_ACCOUNT_USAGE = Script(resources.files("pipeline.controls").joinpath("account_usage.lua").read_text(encoding="utf-8"))
# How long a session's last accounted value is kept after its last report: longer than a session is
# used in practice (a mapping lives a week without use); a session used again later would count its
# whole cumulative value once more, hence the margin.
SEEN_TTL = 45 * 86400
# A window's totals outlive it a little, so `/usage` just after midnight is not empty by surprise.
TOTALS_GRACE = 2 * 86400


def bot_scope(platform: str, bot_id: str) -> str:
    return f"{platform}:{bot_id}"


class BudgetStore:
    """The windows' totals, the last accounted value per session, grants and notice markers."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    def totals_key(self, bot: str, window: Window, scope: Scope, ident: str = "") -> str:
        return self.keys.scoped("budget", bot, f"{bot}:{window.ident}:{scope}:{ident}")

    def _seen_key(self, bot: str, session_id: str) -> str:
        return self.keys.scoped("budget-seen", bot, f"{bot}:{session_id}")

    def notice_key(self, bot: str, window: Window, spent_: Spent, chat_id: str, user_id: str) -> str:
        return self.keys.scoped(
            "budget-noticed", bot, f"{bot}:{window.ident}:{spent_.scope}:{spent_.kind}:{chat_id}:{user_id}"
        )

    async def account(
        self,
        bot: str,
        session_id: str,
        reported: Counted,
        window: Window,
        chat_id: str,
        user_id: str | None,
    ) -> tuple[Counted, Totals]:
        """Account a session's cumulative report into the window's totals of the bot, the chat and
        the user. Returns what it added (nothing for a replay) and the bot's totals after it."""
        keys = [
            self._seen_key(bot, session_id),
            self.totals_key(bot, window, "bot"),
            self.totals_key(bot, window, "chat", chat_id),
        ]
        if user_id:
            keys.append(self.totals_key(bot, window, "user", user_id))
        expire_at = int(window.ends_at.timestamp()) + TOTALS_GRACE
        raw = await self.redis.run_script(
            _ACCOUNT_USAGE, keys, [reported.tokens, reported.active_ms, SEEN_TTL, expire_at]
        )
        added = Counted(int(raw[0]), int(raw[1]))
        return added, Totals(int(raw[2]), int(raw[3]), int(raw[4]), int(raw[5]))

    async def totals(self, keys: list[str]) -> list[Totals]:
        """The totals under several `totals_key`s (of any bots), in one round trip."""
        replies = await self.redis.pipeline(
            [("HMGET", key, "tokens", "ms", "grant_tokens", "grant_ms") for key in keys]
        )
        return [Totals(*(int(v) if v is not None else 0 for v in reply)) for reply in replies]

    async def grant(self, bot: str, window: Window, scope: Scope, ident: str, grant: Grant) -> Totals:
        key = self.totals_key(bot, window, scope, ident)
        field = "grant_tokens" if grant.kind == "tokens" else "grant_ms"
        await self.redis.transaction(
            [("HINCRBY", key, field, grant.amount), ("EXPIREAT", key, int(window.ends_at.timestamp()) + TOTALS_GRACE)]
        )
        (totals,) = await self.totals([key])
        return totals

    async def first_notice(self, key: str, ttl: int) -> bool:
        """Whether this is the first notice under `key` in its window (one per window and sender)."""
        return bool(await self.redis.execute("SET", key, "1", "NX", "EX", ttl))
