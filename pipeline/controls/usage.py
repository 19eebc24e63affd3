"""Usage budgets in the stages: render accounts each turn's `session.usage`; ingest checks the
budgets where a turn would start and answers the admins' `/usage` and `/grant`.

Render accounts every bot's usage (a budget set later starts from the day's real figures, and the
per-bot metrics show it); ingest reads the totals only for bots with a limit set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from pipeline import metrics
from pipeline.addressing import ChatCommand
from pipeline.records import InboundMessage
from pipeline.segments.notices import NoticeKind
from pipeline.session.models import UsageSnapshot
from pipeline.settings import BotConfig
from pipeline.state.client import RedisClient
from pipeline.state.keys import Keys

from .budget_store import BudgetStore, bot_scope
from .budgets import (
    SCOPES,
    Counted,
    Scope,
    Spent,
    Window,
    counted,
    describe,
    parse_grant,
    parse_target,
    spent,
    window_at,
)

log = logging.getLogger(__name__)

# How a report and a grant name the chat itself (a user is named `@<id>`).
_THIS_CHAT = {"en": "this chat", "zh": "本群"}
_SPENT_NOTICE: dict[Scope, NoticeKind] = {
    "chat": NoticeKind.BUDGET_SPENT_CHAT,
    "user": NoticeKind.BUDGET_SPENT_USER,
    "bot": NoticeKind.BUDGET_SPENT_BOT,
}


@dataclass(frozen=True)
class Refusal:
    """A message that starts no turn: which budget is spent, in which window."""

    spent: Spent
    window: Window
    notice_key: str
    ttl: int

    def notice(self, bot: BotConfig, message: InboundMessage) -> tuple[NoticeKind, dict[str, str]]:
        zone = ZoneInfo(bot.budgets.timezone)
        until = f"{self.window.ends_at.astimezone(zone):%Y-%m-%d %H:%M} ({bot.budgets.timezone})"
        params = {"until": until}
        if self.spent.scope == "user":
            params["who"] = f"@{message.sender.name or message.sender.user_id}"
        return _SPENT_NOTICE[self.spent.scope], params


def _utc_now() -> datetime:
    return datetime.now(UTC)


def is_admin(bot: BotConfig, message: InboundMessage) -> bool:
    """The bot's configured admins, and those the platform reports (a group's owner or admins). In a
    private chat nobody is an admin by being there."""
    return message.sender.user_id in bot.admins or (message.chat_type == "group" and message.sender.is_admin)


class UsageBudgets:
    def __init__(self, redis: RedisClient, keys: Keys, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self.store = BudgetStore(redis, keys)
        self.clock = clock

    # -- render ------------------------------------------------------------------------------------
    async def account(
        self, bot: BotConfig, session_id: str, usage: UsageSnapshot, chat_id: str, user_id: str | None
    ) -> Counted:
        """Account a turn's cumulative report (once per session and value, see `account_usage.lua`)."""
        window = window_at(bot.budgets, self.clock())
        added, bot_totals = await self.store.account(
            bot_scope(bot.platform, bot.bot_id),
            session_id,
            counted(usage, bot.budgets.token_kinds),
            window,
            chat_id,
            user_id,
        )
        if added.tokens:
            metrics.child(metrics.BUDGET_TOKENS, bot.platform, bot.bot_id).inc(added.tokens)
        if added.active_ms:
            metrics.child(metrics.BUDGET_ACTIVE_SECONDS, bot.platform, bot.bot_id).inc(added.active_ms / 1000)
            metrics.ACTIVE_SECONDS.inc(added.active_ms / 1000)
        metrics.child(metrics.BUDGET_WINDOW_TOKENS, bot.platform, bot.bot_id).set(bot_totals.tokens)
        return added

    # -- ingest ------------------------------------------------------------------------------------
    async def check(self, asks: list[tuple[BotConfig, InboundMessage]]) -> list[Refusal | None]:
        """Per message that would start a turn: the refusal when one of its bot's budgets is spent.
        One round trip for the whole batch; nothing for bots without a limit."""
        now = self.clock()
        keys: list[str] = []
        wanted: list[tuple[Window, list[Scope]] | None] = []
        for bot, message in asks:
            budgets = bot.budgets
            if not budgets.enabled:
                wanted.append(None)
                continue
            window = window_at(budgets, now)
            scopes = [scope for scope in SCOPES if budgets.limit(scope) is not None]
            ident: dict[Scope, str] = {"chat": message.chat_id, "user": message.sender.user_id, "bot": ""}
            bot_ref = bot_scope(bot.platform, bot.bot_id)
            keys += [self.store.totals_key(bot_ref, window, scope, ident[scope]) for scope in scopes]
            wanted.append((window, scopes))
        if not keys:
            return [None] * len(asks)
        totals = iter(await self.store.totals(keys))
        refusals: list[Refusal | None] = []
        for (bot, message), want in zip(asks, wanted, strict=True):
            if want is None:
                refusals.append(None)
                continue
            window, scopes = want
            found = spent(bot.budgets, {scope: next(totals) for scope in scopes})
            if found is None:
                refusals.append(None)
                continue
            key = self.store.notice_key(
                bot_scope(bot.platform, bot.bot_id), window, found, message.chat_id, message.sender.user_id
            )
            refusals.append(Refusal(found, window, key, window.ttl_until_end(now)))
        return refusals

    async def first_notice(self, refusal: Refusal) -> bool:
        """Whether the refused sender gets the notice: once per window, budget and chat."""
        return await self.store.first_notice(refusal.notice_key, refusal.ttl)

    async def command(
        self, bot: BotConfig, message: InboundMessage, command: ChatCommand
    ) -> tuple[NoticeKind, dict[str, str]]:
        """`/usage [user]` and `/grant <amount> [user]`, for admins: the notice that answers it."""
        if not is_admin(bot, message):
            return NoticeKind.ADMINS_ONLY, {}
        mentions = [m for m in message.mentions if m and m != bot.self_id]
        window = window_at(bot.budgets, self.clock())
        bot_ref = bot_scope(bot.platform, bot.bot_id)
        if command.name == "grant":
            grant = parse_grant(command.argument, mentions)
            if grant is None:
                return NoticeKind.GRANT_HELP, {}
            scope: Scope = "user" if grant.user_id else "chat"
            await self.store.grant(bot_ref, window, scope, grant.user_id or message.chat_id, grant)
            amount = f"{grant.amount} tokens" if grant.kind == "tokens" else f"{grant.amount / 1000:g} s"
            who = f"@{grant.user_id}" if grant.user_id else _THIS_CHAT[bot.language]
            log.info("budgets: a grant of %s to %s by an admin of %s", amount, scope, bot_ref)
            return NoticeKind.BUDGET_GRANTED, {"who": who, "amount": amount, "window": window.label}
        target = parse_target(command.argument, mentions)
        scope = "user" if target else "chat"
        (totals,) = await self.store.totals([self.store.totals_key(bot_ref, window, scope, target or message.chat_id)])
        tokens, seconds = describe(totals, bot.budgets.limit(scope))
        who = f"@{target}" if target else _THIS_CHAT[bot.language]
        return NoticeKind.USAGE_REPORT, {"who": who, "window": window.label, "tokens": tokens, "seconds": seconds}
