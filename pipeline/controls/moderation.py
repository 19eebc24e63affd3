"""Moderation: word and pattern lists per bot, applied to what comes in and to the validated reply
that goes out, and an optional HTTP hook asked about each message that would start or join a turn.

Words match case-insensitively anywhere in the text (there are no word boundaries in Chinese);
patterns are regular expressions (Python `re`, case-insensitive), checked when the bots file is
loaded. Nothing here logs or counts a message's text: callers count the decision and log its ids.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator

if TYPE_CHECKING:  # the settings import this module: httpx is loaded by the stage that calls the hook
    import httpx

log = logging.getLogger(__name__)

REDACTED = "***"


class ModerationHook(BaseModel):
    """`[bots.moderation.hook]`: POST `{"platform", "bot_id", "chat_id", "user_id", "text"}` with
    `Authorization: Bearer <secret>`; the answer `{"allow": true|false}` decides. No answer within
    the timeout, an error status or a malformed answer: `on_failure` decides (`open`: the message
    goes on; `closed`: it is moderated)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^https?://")
    secret: SecretStr
    timeout_seconds: float = Field(default=2.0, gt=0, le=30)
    on_failure: Literal["open", "closed"] = "open"

    @field_validator("secret")
    @classmethod
    def _secret_set(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("needs at least 16 characters")
        return value


class ModerationConfig(BaseModel):
    """`[bots.moderation]`."""

    model_config = ConfigDict(extra="forbid")

    words: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)
    # A moderated inbound message starts no turn: `drop` says nothing, `notice` answers with the
    # notice `moderated`. Either way it is not kept in the group-context window.
    inbound: Literal["drop", "notice"] = "drop"
    # A reply that matches: `block` sends the notice `reply_moderated` instead; `redact` replaces
    # each match with `***`.
    outbound: Literal["block", "redact", "off"] = "block"
    hook: ModerationHook | None = None
    _words: tuple[str, ...] = PrivateAttr(default=())
    _patterns: re.Pattern[str] | None = PrivateAttr(default=None)
    _redactor: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("words")
    @classmethod
    def _no_empty_words(cls, value: list[str]) -> list[str]:
        if any(not w.strip() for w in value):
            raise ValueError("an empty word would match every message")
        return value

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for index, pattern in enumerate(value):
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"patterns[{index}] is not a valid regular expression: {exc}") from exc
            if compiled.search(""):
                raise ValueError(f"patterns[{index}] matches the empty text, so every message")
        return value

    def model_post_init(self, context: object) -> None:
        # Inbound, every group message of the bot is checked: words as substring searches of the
        # lowered text (C speed, ~0.1 µs each), patterns as one compiled alternation. Python's `re`
        # tries each alternative at each position, so 50 words in one regex cost ~35 µs a message
        # (measured), against ~5 µs this way.
        self._words = tuple(w.lower() for w in self.words)
        self._patterns = (
            re.compile("|".join(f"(?:{p})" for p in self.patterns), re.IGNORECASE) if self.patterns else None
        )
        alternatives = [re.escape(w) for w in self.words] + [f"(?:{p})" for p in self.patterns]
        # Redaction (replies only) needs the positions: one regex over both.
        self._redactor = re.compile("|".join(alternatives), re.IGNORECASE) if alternatives else None

    @functools.cached_property
    def lists(self) -> bool:
        # Read for every group message: a private attribute goes through pydantic's `__getattr__`
        # (about 1.5 µs a read), a cached property is a plain attribute once computed.
        return self._redactor is not None

    def matches(self, text: str) -> bool:
        if self._words:
            lowered = text.lower()
            if any(word in lowered for word in self._words):
                return True
        return self._patterns is not None and self._patterns.search(text) is not None

    def redact(self, text: str) -> tuple[str, int]:
        if self._redactor is None:
            return text, 0
        return self._redactor.subn(REDACTED, text)


@dataclass(frozen=True, slots=True)
class ModerationVerdict:
    allowed: bool
    reason: str  # list | hook | hook_failed | clean (a label: never the text)


async def ask_hook(
    client: httpx.AsyncClient,
    hook: ModerationHook,
    *,
    platform: str,
    bot_id: str,
    chat_id: str,
    user_id: str,
    text: str,
) -> ModerationVerdict:
    """The hook's verdict on one message; a failure is `hook_failed`, allowed when it fails open."""
    import httpx

    try:
        response = await client.post(
            hook.url,
            json={"platform": platform, "bot_id": bot_id, "chat_id": chat_id, "user_id": user_id, "text": text},
            headers={"Authorization": f"Bearer {hook.secret.get_secret_value()}"},
            timeout=hook.timeout_seconds,
        )
        response.raise_for_status()
        answer = response.json()
        allow = answer.get("allow") if isinstance(answer, dict) else None
        if not isinstance(allow, bool):
            raise ValueError("the answer has no boolean `allow`")
    except (httpx.HTTPError, ValueError) as exc:
        log.warning(
            "moderation hook of %s/%s failed (%s); failing %s", platform, bot_id, type(exc).__name__, hook.on_failure
        )
        return ModerationVerdict(hook.on_failure == "open", "hook_failed")
    return ModerationVerdict(allow, "clean" if allow else "hook")


@dataclass(frozen=True, slots=True)
class ModeratedReply:
    texts: list[str]  # redacted where they hit (unchanged when blocked: the caller sends the notice)
    hits: int
    blocked: bool


def moderate_reply(config: ModerationConfig, texts: Sequence[str]) -> ModeratedReply:
    """A reply's texts (its text and markdown segments) checked against the bot's lists: no hit,
    redacted, or `blocked` (the caller sends the notice `reply_moderated` instead)."""
    if not config.lists or config.outbound == "off":
        return ModeratedReply(list(texts), 0, False)
    out: list[str] = []
    hits = 0
    for text in texts:
        redacted, n = config.redact(text)
        out.append(redacted)
        hits += n
    return ModeratedReply(out, hits, hits > 0 and config.outbound == "block")
