"""Inbound rate limits: how many turns a user, a chat and a bot may start per window.

Fixed windows (a counter per scope and window index), shared by every worker through Redis: one
script call per batch and bot (`pipeline.state.limits`, `scripts/admit_turns.lua`), every key of one
bot's limits under the bot's hash tag. A message over a limit starts no turn; the first one over it
in a window gets the notice `rate_limited`, the rest nothing. Admins of the bot are exempt and not
counted; chat commands never reach the limits (ingest handles them before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LimitScope = Literal["user", "chat", "bot"]
_SCOPES: tuple[LimitScope, ...] = ("user", "chat", "bot")


class LimitWindow(BaseModel):
    """At most `count` turns per `per_seconds` (a fixed window, aligned to the epoch)."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(gt=0)
    per_seconds: int = Field(gt=0, le=31 * 86400)


class LimitsConfig(BaseModel):
    """`[bots.limits]`: turns per user (across the bot's chats), per chat and per bot."""

    model_config = ConfigDict(extra="forbid")

    user_turns: LimitWindow | None = None
    chat_turns: LimitWindow | None = None
    bot_turns: LimitWindow | None = None
    # The group-context buffer: messages per window the chat, and one user in it, may add to the
    # chat's context window (what the agent reads as context). Past either, a message is not kept
    # there (whether it triggers is the turn limits' business), so a flood cannot push out the rest.
    chat_messages: LimitWindow | None = None
    user_messages: LimitWindow | None = None
    # What becomes of a message over a limit: `drop` (gone, not in the chat's context window
    # either) or `hold` (kept in the group-context window: the next turn within the limits sees it).
    over_limit: Literal["drop", "hold"] = "drop"
    # The notice `rate_limited`, once per window (per user, or per chat for the chat and bot limits).
    notice: bool = True

    def windows(self) -> list[tuple[LimitScope, LimitWindow]]:
        configured = (self.user_turns, self.chat_turns, self.bot_turns)
        return [(scope, window) for scope, window in zip(_SCOPES, configured, strict=True) if window is not None]

    def window(self, scope: LimitScope) -> LimitWindow | None:
        return self.user_turns if scope == "user" else self.chat_turns if scope == "chat" else self.bot_turns

    @property
    def active(self) -> bool:
        return any(w is not None for w in (self.user_turns, self.chat_turns, self.bot_turns))


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A message that would start or join a turn: its stable de-duplication id, sender and chat."""

    dedup_id: str
    user_id: str
    chat_id: str
    exempt: bool = False


@dataclass(frozen=True, slots=True)
class LimitDecision:
    allowed: bool
    scope: LimitScope | None = None  # the limit it is over
    notice: bool = False  # the first over that limit in its window: tell the chat
    again: bool = False  # the answer given to this message before (a replay): counted then, not now

    @property
    def outcome(self) -> str:
        return "allowed" if self.allowed else "noticed" if self.notice else "limited"


ALLOWED = LimitDecision(True)


@dataclass(frozen=True, slots=True)
class Counter:
    scope: LimitScope
    ident: str  # `<scope>:<id>:<window index>`
    limit: int
    window_ms: int


def counters(config: LimitsConfig, request: TurnRequest, now_ms: int) -> list[Counter]:
    """The windows a request counts in, at `now_ms`. The notice of the chat and bot limits is per
    chat (every chat hears once why it gets no answers), of the user limit per user."""
    out = []
    for scope, window in config.windows():
        window_ms = window.per_seconds * 1000
        index = now_ms // window_ms
        subject = request.user_id if scope == "user" else request.chat_id if scope == "chat" else "-"
        out.append(Counter(scope, f"{scope}:{subject}:{index}", window.count, window_ms))
    return out


def message_windows(config: LimitsConfig, user_id: str, now_ms: int) -> tuple[Counter, Counter] | None:
    """The chat's and the user's message counters for the group-context buffer at `now_ms` (a
    limit 0: none), or None when the bot limits neither."""
    if config.chat_messages is None and config.user_messages is None:
        return None
    chat, user = config.chat_messages, config.user_messages
    chat_ms = (chat.per_seconds if chat else 60) * 1000
    user_ms = (user.per_seconds if user else 60) * 1000
    return (
        Counter("chat", f"chat:{now_ms // chat_ms}", chat.count if chat else 0, chat_ms),
        Counter("user", f"user:{user_id}:{now_ms // user_ms}", user.count if user else 0, user_ms),
    )


def notice_ident(counter: Counter, request: TurnRequest) -> str:
    return counter.ident if counter.scope != "bot" else f"{counter.ident}:{request.chat_id}"
