"""Whether a chat message is addressed to the bot: a chat command (`/stop`, `/reset`, `/allow`,
`/deny`), or a trigger of the bot's policy (private, a mention, a reply to the bot, the command
prefix, a keyword).

Ingest decides with these what a message starts; the console platform answers the page with the
same decision (`addressed`), so both import them from here, below either of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pipeline.records import InboundMessage
from pipeline.settings import BotConfig

TriggerReason = Literal["private", "mention", "reply_to_bot", "command", "keyword"]
CommandName = Literal["stop", "reset", "allow", "deny", "usage", "grant"]
_COMMAND_RE = re.compile(r"^\s*/(stop|reset|allow|deny|usage|grant)(?:@\S+)?(?:\s+(.*))?$", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class ChatCommand:
    name: CommandName
    argument: str = ""


def parse_chat_command(text: str) -> ChatCommand | None:
    """`/stop`, `/reset`, `/allow [tool id]`, `/deny [reason]`, and the usage budgets' `/usage [user]`
    and `/grant <amount> [user]` (Telegram's `/stop@botname` too)."""
    match = _COMMAND_RE.match(text)
    if match is None:
        return None
    return ChatCommand(name=match.group(1).lower(), argument=(match.group(2) or "").strip())  # type: ignore[arg-type]


def trigger_reason(message: InboundMessage, bot: BotConfig) -> TriggerReason | None:
    """Why this message should start a turn, or None. Private: always; group: per policy."""
    if message.chat_type == "private":
        return "private"
    policy = bot.trigger
    if policy.mention and (message.mentions_bot or (bot.self_id is not None and bot.self_id in message.mentions)):
        return "mention"
    if policy.reply_to_bot and message.reply_to is not None and message.reply_to.is_bot:
        return "reply_to_bot"
    text = message.text.lstrip()
    if policy.command_prefix and text.startswith(policy.command_prefix):
        return "command"
    if policy.keywords:
        lowered = text.lower()
        if any(keyword.lower() in lowered for keyword in policy.keywords):
            return "keyword"
    return None


def strip_trigger(text: str, bot: BotConfig) -> str:
    """Remove the command prefix a message was triggered with (the agent needs the question)."""
    prefix = bot.trigger.command_prefix
    stripped = text.lstrip()
    if prefix and stripped.startswith(prefix):
        return stripped[len(prefix) :].lstrip()
    return text
