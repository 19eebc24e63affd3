"""Dead letters as the operator sees them: filtered, counted, summarised without message bodies,
and planned for a replay. Pure: the records come in already read (`pipeline.operator.kafka`), the
bots and platforms are given, the clock is an argument.

A replay puts a record back on the topic its stage reads, unchanged but for `hops["replay"]` (when
it was replayed), which the stages count (`switchboard_replayed_records_total`) and log. Its ids are
the original's, so whatever already made a replay of the topic harmless (egress's delivered
markers per outbound id, ingest's inbound ids, the session events' ids) makes this one harmless too.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.platforms import Platform
from pipeline.records import (
    DeadLetter,
    InboundMessage,
    OutboundMessage,
    SessionCommand,
    SessionEventRecord,
    join_ids,
    parse_conversation_key,
    split_ids,
)
from pipeline.settings import BotConfig
from pipeline.topics import IM_INBOUND, SESSION_EVENTS, SESSION_INPUT, outbound_topic

#: The topic each stage reads: where its dead letters go back to (egress: its platform's).
STAGE_TOPICS: Mapping[str, str] = {"ingest": IM_INBOUND, "dispatch": SESSION_INPUT, "render": SESSION_EVENTS}
_OUTBOUND_PREFIX = outbound_topic("")

#: Reasons a replay leaves out unless `--reason` names them: the platform may have shown the message
#: (a send written to a connection whose answer never came), so sending it again may show it twice.
UNSURE_REASONS = frozenset({"outcome_unknown"})
#: Reasons that say the platform's reply window had closed (QQ's passive replies, Discord's
#: interaction token): a later send cannot succeed either.
WINDOW_CLOSED_REASONS = frozenset({"passive_window_expired", "invalid_webhook_token"})
#: How much of an error a listing shows (`show` shows all of it).
ERROR_EXCERPT_CHARS = 200


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Letter:
    """One record of `im.deadletter`: where it is, and the dead letter (None: not one, unreadable)."""

    partition: int
    offset: int
    timestamp_ms: int
    dead: DeadLetter | None
    platform: str | None = None
    bot_id: str | None = None
    chat_id: str | None = None

    @classmethod
    def of(cls, partition: int, offset: int, timestamp_ms: int, value: bytes | None) -> Letter:
        try:
            dead: DeadLetter | None = DeadLetter.model_validate_json(value or b"")
        except ValidationError:
            dead = None
        platform, bot_id, chat_id = _origin(dead) if dead is not None else (None, None, None)
        return cls(partition, offset, timestamp_ms, dead, platform, bot_id, chat_id)

    @property
    def position(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def stage(self) -> str:
        return self.dead.stage if self.dead is not None else "?"

    @property
    def reason(self) -> str:
        return self.dead.reason if self.dead is not None else "unreadable"

    @property
    def at_ms(self) -> float:
        return self.dead.at_ms if self.dead is not None else float(self.timestamp_ms)


def _origin(dead: DeadLetter) -> tuple[str | None, str | None, str | None]:
    """Platform, bot and chat of the original: from its fields where it parses, else from its key
    (a conversation key, or `platform:bot` of a webhook body)."""
    try:
        original = json.loads(dead.record)
    except ValueError:
        original = None
    if isinstance(original, dict) and isinstance(original.get("platform"), str):
        bot, chat = original.get("bot_id"), original.get("chat_id")
        return original["platform"], bot if isinstance(bot, str) else None, chat if isinstance(chat, str) else None
    if dead.key:
        try:
            ref = parse_conversation_key(dead.key)
            return ref.platform, ref.bot_id, ref.chat_id
        except ValueError:
            ids = split_ids(dead.key)
            if len(ids) == 2:
                return ids[0], ids[1], None
    return None, None, None


# -- selecting --------------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_when(text: str, now_ms: float) -> float:
    """A time as Unix ms: a duration back from now (`90s`, `30m`, `2h`, `7d`) or an ISO 8601 time
    (`2026-12-06T10:00`, UTC unless it says otherwise). ValueError naming the forms otherwise."""
    match = _DURATION.match(text.strip())
    if match:
        return now_ms - float(match[1]) * _UNIT_MS[match[2]]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration (90s, 30m, 2h, 7d) nor an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp() * 1000


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters an operator asked for; an empty set takes any value."""

    stages: frozenset[str] = frozenset()
    reasons: frozenset[str] = frozenset()
    platforms: frozenset[str] = frozenset()
    bots: frozenset[str] = frozenset()
    chats: frozenset[str] = frozenset()
    since_ms: float | None = None
    until_ms: float | None = None

    def matches(self, letter: Letter) -> bool:
        return (
            (not self.stages or letter.stage in self.stages)
            and (not self.reasons or letter.reason in self.reasons)
            and (not self.platforms or letter.platform in self.platforms)
            and (not self.bots or letter.bot_id in self.bots)
            and (not self.chats or letter.chat_id in self.chats)
            and (self.since_ms is None or letter.at_ms >= self.since_ms)
            and (self.until_ms is None or letter.at_ms < self.until_ms)
        )

    def select(self, letters: Iterable[Letter]) -> list[Letter]:
        return [letter for letter in letters if self.matches(letter)]


def counts(letters: Iterable[Letter]) -> list[tuple[str, str, int]]:
    """(stage, reason, count), the most frequent first."""
    counted = Counter((letter.stage, letter.reason) for letter in letters)
    return [(stage, reason, n) for (stage, reason), n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))]


# -- describing -------------------------------------------------------------------------------------


def iso(ms: float) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def summary(letter: Letter, *, bodies: bool = False, full_error: bool = False) -> dict[str, Any]:
    """What a listing shows of a dead letter: where it is, why, whose; the original record (a
    message body) only with `bodies`."""
    dead = letter.dead
    row: dict[str, Any] = {
        "position": letter.position,
        "at": iso(letter.at_ms),
        "stage": letter.stage,
        "reason": letter.reason,
        "platform": letter.platform,
        "bot": letter.bot_id,
        "chat": letter.chat_id,
    }
    if dead is None:
        return row
    row |= {
        "attempts": dead.attempts,
        "key": dead.key,
        "source": f"{dead.topic}[{dead.partition}]@{dead.offset}" if dead.topic is not None else None,
        "error": dead.error if full_error else dead.error[:ERROR_EXCERPT_CHARS],
        "excerpt": dead.record_bytes is not None,
    }
    row["original"] = original_outline(dead)
    if bodies:
        row["record"] = dead.record
    return row


def original_outline(dead: DeadLetter) -> dict[str, Any]:
    """The original's ids and shape, no text: what `show` says of it without `--bodies`."""
    outline: dict[str, Any] = {"bytes": dead.record_bytes or len(dead.record.encode())}
    if dead.record_sha256:
        outline["sha256"] = dead.record_sha256
    try:
        original = json.loads(dead.record)
    except ValueError:
        return outline | {"parses": False}
    if not isinstance(original, dict):
        return outline | {"parses": False}
    for name in ("outbound_id", "kind", "message_id", "session_id", "conversation_key", "trace_id", "chat_type"):
        if isinstance(original.get(name), str):
            outline[name] = original[name]
    segments = original.get("segments")
    if isinstance(segments, list):
        outline["segments"] = [s.get("type") for s in segments if isinstance(s, dict)]
    event = original.get("event")
    if isinstance(event, dict) and isinstance(event.get("type"), str):
        outline["event"] = event["type"]
    return outline


def render_table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """Plain aligned columns; None shows as `-`."""
    cells = [[("-" if row.get(c) is None else str(row.get(c))) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return lines


# -- replaying --------------------------------------------------------------------------------------


def value_model(topic: str) -> type[BaseModel] | None:
    """The record model of a topic a replay may write to; None for any other topic."""
    if topic.startswith(_OUTBOUND_PREFIX):
        return OutboundMessage
    models: dict[str, type[BaseModel]] = {
        IM_INBOUND: InboundMessage,
        SESSION_INPUT: SessionCommand,
        SESSION_EVENTS: SessionEventRecord,
    }
    return models.get(topic)


def target_topic(letter: Letter) -> str | None:
    """Where a dead letter goes back to: the topic it was read from, else its stage's topic."""
    dead = letter.dead
    if dead is None:
        return None
    if dead.topic is not None and value_model(dead.topic) is not None:
        return dead.topic
    if dead.stage == "egress" and letter.platform:
        return outbound_topic(letter.platform)
    return STAGE_TOPICS.get(dead.stage)


@dataclass(frozen=True)
class Planned:
    """One selected dead letter in a replay: what would go where, or why it does not go."""

    letter: Letter
    topic: str | None = None
    key: str | None = None
    value: bytes | None = None
    skip: str | None = None  # why it is not sent (a short label) …
    detail: str = ""  # … and what that means for this record
    # Egress: the delivered marker that says it went out already (bot scope, outbound id).
    delivered_marker: tuple[str, str] | None = None

    @property
    def sendable(self) -> bool:
        return self.skip is None

    def skipped(self, skip: str, detail: str) -> Planned:
        return Planned(self.letter, self.topic, self.key, None, skip, detail, self.delivered_marker)

    def row(self) -> dict[str, Any]:
        row = summary(self.letter)
        del row["original"]
        return row | {"topic": self.topic, "skip": self.skip, "detail": self.detail or None}


@dataclass
class ReplayContext:
    """What a plan needs to know of the deployment: its bots and platforms, and the time."""

    bot: Callable[[str, str], BotConfig | None]
    platform: Callable[[str], Platform | None]
    now_ms: float
    # Reasons the operator named (`--reason`): the only way a record of UNSURE_REASONS is replayed.
    named_reasons: frozenset[str] = frozenset()
    # Position → the whole original, read back from its topic, for a dead letter that keeps an excerpt.
    originals: dict[str, bytes] = field(default_factory=dict)


def plan(letters: Iterable[Letter], context: ReplayContext) -> list[Planned]:
    """Each letter's plan; of several letters of one outbound message (dead-lettered, replayed,
    dead-lettered again) only the newest is sent."""
    planned = [plan_one(letter, context) for letter in letters]
    newest: dict[tuple[str, str], int] = {}
    for index, item in enumerate(planned):
        if item.sendable and item.delivered_marker is not None:
            newest[item.delivered_marker] = index
    return [
        item.skipped("duplicate", f"a newer dead letter of the same message, {planned[newest[marker]].letter.position}")
        if item.sendable and (marker := item.delivered_marker) is not None and newest[marker] != index
        else item
        for index, item in enumerate(planned)
    ]


def plan_one(letter: Letter, context: ReplayContext) -> Planned:
    dead = letter.dead
    topic = target_topic(letter)
    base = Planned(letter, topic, dead.key if dead is not None else None)
    if dead is None:
        return base.skipped("unreadable", "the dead letter itself does not parse")
    if topic is None:
        why = "a webhook body that did not parse" if dead.stage == "ingress" else "no topic to put it back on"
        return base.skipped("not_replayable", why)
    if dead.reason in UNSURE_REASONS and dead.reason not in context.named_reasons:
        return base.skipped(
            "unsure",
            f"the platform may have shown it; replayed only with --reason {dead.reason} (check the chat first)",
        )
    raw = dead.record.encode()
    if dead.record_bytes is not None:
        fetched = context.originals.get(letter.position)
        if fetched is None:
            return base.skipped("excerpt_only", f"keeps an excerpt; the original left {dead.topic} (retention)")
        raw = fetched
    model = value_model(topic)
    assert model is not None  # target_topic names only topics with a model
    try:
        record = model.model_validate_json(raw)
    except ValidationError as exc:
        return base.skipped("unparsable", f"not a {model.__name__}: {exc.error_count()} error(s)")
    key = dead.key or getattr(record, "conversation_key", None)
    base = Planned(letter, topic, key)
    marker = None
    if isinstance(record, OutboundMessage):
        problem = _outbound_check(record, dead, context)
        if problem is not None:
            return base.skipped(*problem)
        marker = _marker(record, context)
    elif isinstance(record, SessionCommand | InboundMessage) and context.bot(record.platform, record.bot_id) is None:
        return base.skipped("unknown_bot", f"no bot {record.platform}/{record.bot_id} in these settings")
    return Planned(letter, topic, key, mark_replayed(raw, context.now_ms), delivered_marker=marker)


def _outbound_check(message: OutboundMessage, dead: DeadLetter, context: ReplayContext) -> tuple[str, str] | None:
    bot = context.bot(message.platform, message.bot_id)
    if bot is None:
        return "unknown_bot", f"no bot {message.platform}/{message.bot_id} in these settings"
    platform = context.platform(message.platform)
    if platform is None:
        return "unknown_platform", f"no platform {message.platform!r} in this version"
    closed = reply_window_closed(message, dead.reason, platform, bot, context.now_ms)
    return ("past_reply_window", closed) if closed else None


def reply_window_closed(
    message: OutboundMessage, reason: str, platform: Platform, bot: BotConfig, now_ms: float
) -> str | None:
    """Why a reply can no longer be sent (its platform's window for answering the user's message
    has closed), or None. A bot that sends active messages past the window (QQ) still can."""
    if platform.profile.reply_window and bot.active_messages:
        return None
    if platform.profile.reply_window:
        deadline = platform.reply_deadline_ms(bot, message.chat_id, message.route)
        if deadline is not None and now_ms > deadline:
            return f"{message.platform}'s reply window closed at {iso(deadline)}"
    if reason in WINDOW_CLOSED_REASONS:
        return f"{message.platform} refused it as past its reply window ({reason})"
    return None


def _marker(message: OutboundMessage, context: ReplayContext) -> tuple[str, str] | None:
    """Egress's delivered marker of the message (bot scope, outbound id), where egress keeps one."""
    platform = context.platform(message.platform)
    if platform is None or platform.profile.delivers_once:
        return None
    return join_ids(message.platform, message.bot_id), message.outbound_id


def mark_replayed(raw: bytes, now_ms: float) -> bytes:
    """The record with `hops["replay"]` set to when it was replayed (every record type has hops);
    every other field as it was."""
    data = json.loads(raw)
    hops = data.get("hops")
    data["hops"] = {**(hops if isinstance(hops, dict) else {}), "replay": now_ms}
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def tally(planned: Iterable[Planned]) -> dict[str, int]:
    """How many would be sent (`replay`) and how many are skipped, by why."""
    counted = Counter(p.skip or "replay" for p in planned)
    return dict(sorted(counted.items(), key=lambda kv: (kv[0] != "replay", -kv[1], kv[0])))
