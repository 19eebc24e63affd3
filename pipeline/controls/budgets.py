"""Usage budgets: tokens and active seconds per chat, per user and per bot, over a calendar day or
month in the bot's time zone, accounted from the `session.usage` events the sessions report.

`session.usage` is cumulative per session (P9, P10), and a turn's events are replayed after a crash
(the stream resumes from the last handled idle). So render accounts the difference to the last
cumulative value accounted for the session, kept in Redis next to the totals, in one script call
(`account_usage.lua`): a replayed (or older) snapshot adds nothing, whichever worker sees it.

Ingest checks the budgets where a turn would start: one read of the windows' totals per batch that
has triggering messages (for bots with budgets only). Over budget, the message starts no turn, and
its sender gets one notice per window and budget; a turn already running finishes and is counted.

The configuration and the decisions (windows, deltas, which budget is spent, commands) are pure
here; `budget_store` is the Redis side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:  # settings import this module: it stays light
    from pipeline.session.models import UsageSnapshot

Scope = Literal["chat", "user", "bot"]
TokenKind = Literal["input", "output", "cache_read", "cache_creation"]
SCOPES: tuple[Scope, ...] = ("chat", "user", "bot")


# -- configuration ---------------------------------------------------------------------------------
class BudgetLimit(BaseModel):
    """What one chat, user or bot may spend in a window; an absent limit is no limit."""

    model_config = ConfigDict(extra="forbid")

    tokens: int | None = Field(default=None, ge=1)
    active_seconds: float | None = Field(default=None, gt=0)


def _default_token_kinds() -> list[TokenKind]:
    return ["input", "output", "cache_creation"]


class Budgets(BaseModel):
    """`[bots.budgets]` of a bot. Off unless at least one limit is set."""

    model_config = ConfigDict(extra="forbid")

    # Calendar windows: a day or a month, turning over at midnight in `timezone` (IANA name).
    period: Literal["day", "month"] = "day"
    timezone: str = "UTC"
    # What counts as tokens: input and output, and cache writes (billed at least as input); cache
    # reads are cheap and left out unless listed.
    token_kinds: list[TokenKind] = Field(default_factory=_default_token_kinds)
    per_chat: BudgetLimit | None = None
    per_user: BudgetLimit | None = None
    per_bot: BudgetLimit | None = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"budgets.timezone {value!r} is not an IANA time zone") from exc
        return value

    @property
    def enabled(self) -> bool:
        return any(self.limit(scope) is not None for scope in SCOPES)

    def limit(self, scope: Scope) -> BudgetLimit | None:
        found = {"chat": self.per_chat, "user": self.per_user, "bot": self.per_bot}[scope]
        if found is None or (found.tokens is None and found.active_seconds is None):
            return None
        return found


# -- windows ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One calendar window: `ident` names it in keys (`d2026-12-06`, `m2026-12`), `label` for people."""

    ident: str
    label: str
    ends_at: datetime  # aware, UTC

    def ttl_until_end(self, now: datetime) -> int:
        """Seconds until the window ends, at least 1 (what a notice marker lives)."""
        return max(1, int((self.ends_at - now).total_seconds()) + 1)


def window_at(budgets: Budgets, now: datetime) -> Window:
    """The window `now` (aware) falls in, in the bot's time zone."""
    zone = ZoneInfo(budgets.timezone)
    local = now.astimezone(zone)
    if budgets.period == "day":
        first = local.date()
        following = first + timedelta(days=1)
        return Window(f"d{first:%Y-%m-%d}", f"{first:%Y-%m-%d}", _midnight(following, zone))
    first = local.date().replace(day=1)
    following = (
        first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
    )
    return Window(f"m{first:%Y-%m}", f"{first:%Y-%m}", _midnight(following, zone))


def _midnight(day: date, zone: ZoneInfo) -> datetime:
    """The start of `day` in `zone`, in UTC (midnight on the wall clock, whatever the DST)."""
    return datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)


# -- accounting ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Counted:
    """What a budget counts of a usage: tokens, and active time in milliseconds (integers, so the
    Redis totals add exactly)."""

    tokens: int = 0
    active_ms: int = 0


def counted(usage: UsageSnapshot, kinds: list[TokenKind]) -> Counted:
    by_kind = {
        "input": usage.input_tokens,
        "output": usage.output_tokens,
        "cache_read": usage.cache_read_input_tokens,
        "cache_creation": usage.cache_creation.ephemeral_1h_input_tokens
        + usage.cache_creation.ephemeral_5m_input_tokens,
    }
    return Counted(
        tokens=sum(max(0, by_kind[k]) for k in set(kinds)), active_ms=max(0, round(usage.active_seconds * 1000))
    )


def delta(accounted: Counted, reported: Counted) -> Counted:
    """What a cumulative report adds to what was accounted for its session: never negative (a
    replayed or older report adds nothing). `account_usage.lua` does the same in Redis."""
    return Counted(max(0, reported.tokens - accounted.tokens), max(0, reported.active_ms - accounted.active_ms))


@dataclass(frozen=True)
class Totals:
    """A scope's totals in a window, with what admins granted on top of the limit."""

    tokens: int = 0
    active_ms: int = 0
    granted_tokens: int = 0
    granted_ms: int = 0


@dataclass(frozen=True)
class Spent:
    """The first budget found spent: its scope and what ran out."""

    scope: Scope
    kind: Literal["tokens", "active_seconds"]


def spent(budgets: Budgets, totals: dict[Scope, Totals]) -> Spent | None:
    """Which budget a new turn would overrun (chat, then user, then bot), or None. A budget is
    spent once its total reaches the limit plus what was granted: the turn that crosses it runs to
    its end, and the next one is refused."""
    for scope in SCOPES:
        limit = budgets.limit(scope)
        total = totals.get(scope)
        if limit is None or total is None:
            continue
        if limit.tokens is not None and total.tokens >= limit.tokens + total.granted_tokens:
            return Spent(scope, "tokens")
        if limit.active_seconds is not None and total.active_ms >= limit.active_seconds * 1000 + total.granted_ms:
            return Spent(scope, "active_seconds")
    return None


# -- admin commands --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    amount: int  # tokens, or milliseconds of active time
    kind: Literal["tokens", "active_seconds"]
    user_id: str | None  # None: the chat


_AMOUNT = re.compile(r"^(\d+)(k|s|m|h)?$", re.IGNORECASE)


def parse_target(argument: str, mentions: list[str]) -> str | None:
    """The user a `/usage` or `/grant` names: the first mention, else an `@id` or bare id word that is
    not an amount."""
    if mentions:
        return mentions[0]
    for word in argument.split():
        if word.startswith("@") and len(word) > 1:
            return word[1:]
        if _AMOUNT.match(word) is None:
            return word
    return None


def parse_grant(argument: str, mentions: list[str]) -> Grant | None:
    """`/grant 5000` (tokens to the chat), `/grant 20k @alice` (to a user), `/grant 600s` or
    `/grant 10m` / `2h` (active time). None when no amount is given."""
    for word in argument.split():
        match = _AMOUNT.match(word)
        if match is None:
            continue
        number, unit = int(match.group(1)), (match.group(2) or "").lower()
        if number <= 0:
            return None
        target = parse_target(" ".join(w for w in argument.split() if w != word), mentions)
        if unit in ("s", "m", "h"):
            seconds = number * {"s": 1, "m": 60, "h": 3600}[unit]
            return Grant(seconds * 1000, "active_seconds", target)
        return Grant(number * (1000 if unit == "k" else 1), "tokens", target)
    return None


def describe(totals: Totals, limit: BudgetLimit | None) -> tuple[str, str]:
    """(tokens, seconds) as a report shows them: `1200 / 10000 (+5000)`; no limit: the total."""

    def part(used: float, cap: float | None, granted: float) -> str:
        text = f"{used:g}"
        if cap is not None:
            text += f" / {cap:g}"
        if granted:
            text += f" (+{granted:g})"
        return text

    return (
        part(totals.tokens, limit.tokens if limit else None, totals.granted_tokens),
        part(
            round(totals.active_ms / 1000, 1),
            limit.active_seconds if limit else None,
            round(totals.granted_ms / 1000, 1),
        ),
    )
